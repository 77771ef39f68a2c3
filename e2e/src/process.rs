//! Child processes that never outlive their owner.
//!
//! A [`Lifetime::Tied`] process is started through `setpriv --pdeathsig KILL`
//! from a spawner thread that lives as long as the test process, so the kernel
//! kills it when the test process dies for any reason, SIGKILL included. Its
//! [`Process`] handle also stops it on drop (a test that panics unwinds and
//! drops its control plane). A [`Lifetime::Detached`] process (`make cluster`)
//! runs in its own process group and survives the command that started it.

use std::{
    fs::{self, File},
    io::{self, Read, Seek, SeekFrom},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{OnceLock, mpsc},
    thread,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use crate::error::Error;

/// How long a process has to exit after SIGTERM before it gets SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Whether a process dies with the process that started it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifetime {
    /// Killed by the kernel when the starting process exits (tests).
    Tied,
    /// Runs on after the starting process exits (`make cluster`).
    Detached,
}

/// A running component.
#[derive(Debug)]
pub struct Process {
    name: String,
    pid: u32,
    child: Option<Child>,
    log: PathBuf,
    started: Started,
}

/// How a process was started, to start it again.
#[derive(Debug, Clone)]
struct Started {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    lifetime: Lifetime,
}

impl Process {
    /// Starts `program args…` with stdout and stderr appended to `log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        log: PathBuf,
        lifetime: Lifetime,
    ) -> Result<Self, Error> {
        Self::spawn_with_env(name, program, args, &[], log, lifetime)
    }

    /// Like [`Process::spawn`], with these variables added to the environment.
    pub fn spawn_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: PathBuf,
        lifetime: Lifetime,
    ) -> Result<Self, Error> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(Error::io("open log", &log))?;
        let err = out.try_clone().map_err(Error::io("open log", &log))?;
        let mut command = match lifetime {
            Lifetime::Tied => {
                let mut c = Command::new("setpriv");
                c.args(["--pdeathsig", "KILL", "--"]).arg(program);
                c
            }
            Lifetime::Detached => {
                let mut c = Command::new(program);
                std::os::unix::process::CommandExt::process_group(&mut c, 0);
                c
            }
        };
        command
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = match lifetime {
            Lifetime::Tied => spawn_from_long_lived_thread(command),
            Lifetime::Detached => command.spawn(),
        }
        .map_err(Error::io("start", program))?;
        tracing::debug!(name, pid = child.id(), log = %log.display(), "started");
        Ok(Self {
            name: name.to_owned(),
            pid: child.id(),
            child: Some(child),
            log,
            started: Started {
                program: program.to_owned(),
                args: args.to_vec(),
                env: env
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                lifetime,
            },
        })
    }

    /// The component's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// An error with the end of the log if the process has exited.
    pub fn check_running(&mut self) -> Result<(), Error> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        match child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(self.exited(status.to_string())),
            Err(e) => Err(self.exited(e.to_string())),
        }
    }

    /// Leaves the process running and forgets it (detached clusters).
    pub fn release(mut self) -> u32 {
        self.child = None;
        self.pid
    }

    /// Kills the process with SIGKILL (no chance to clean up, as a crash or
    /// the OOM killer) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            tracing::debug!(name = %self.name, pid = self.pid, "killed");
        }
    }

    /// Starts the program again exactly as it was started, appending to the
    /// same log.
    pub fn respawn(&self) -> Result<Self, Error> {
        let Started {
            program,
            args,
            env,
            lifetime,
        } = &self.started;
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Self::spawn_with_env(&self.name, program, args, &env, self.log.clone(), *lifetime)
    }

    /// SIGTERM, then SIGKILL after a grace period; waits for the exit.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(None)) {
            let _ = kill(pid(self.pid), Signal::SIGTERM);
            let deadline = Instant::now() + STOP_GRACE;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
        }
        let _ = child.wait();
        tracing::debug!(name = %self.name, pid = self.pid, "stopped");
    }

    fn exited(&self, status: String) -> Error {
        Error::Exited {
            name: self.name.clone(),
            status,
            log: self.log.clone(),
            tail: log_tail(&self.log, 40),
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Stops a process this harness started detached, found by pid. The pid is
/// only signalled while `/proc/<pid>/cmdline` still names `binary`, so a
/// recycled pid is never killed.
pub fn stop_detached(pid_number: u32, binary: &str) -> bool {
    let is_ours = || {
        fs::read(format!("/proc/{pid_number}/cmdline"))
            .is_ok_and(|cmd| String::from_utf8_lossy(&cmd).contains(binary))
    };
    if !is_ours() {
        return false;
    }
    let _ = kill(pid(pid_number), Signal::SIGTERM);
    let deadline = Instant::now() + STOP_GRACE;
    while is_ours() && !is_zombie(pid_number) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    if is_ours() {
        let _ = kill(pid(pid_number), Signal::SIGKILL);
    }
    true
}

/// Whether a process with this pid still exists and holds resources.
///
/// A zombie counts as gone only once its last thread has exited: when a
/// multi-threaded (Go) process is killed, its leader turns zombie while the
/// other threads, which still hold its sockets, are torn down.
pub fn is_alive(pid_number: u32) -> bool {
    Path::new(&format!("/proc/{pid_number}")).exists() && !is_zombie(pid_number)
}

fn is_zombie(pid_number: u32) -> bool {
    let leader_zombie = fs::read_to_string(format!("/proc/{pid_number}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(") ")
                .map(|(_, rest)| rest.starts_with('Z'))
        })
        .unwrap_or(false);
    let threads = fs::read_dir(format!("/proc/{pid_number}/task"))
        .map(Iterator::count)
        .unwrap_or(0);
    leader_zombie && threads <= 1
}

fn pid(number: u32) -> Pid {
    Pid::from_raw(i32::try_from(number).unwrap_or(i32::MAX))
}

/// The last `lines` lines of a log file.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(mut file) = File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

type SpawnJob = (Command, mpsc::Sender<io::Result<Child>>);

/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not
/// the process. Test threads come and go, so tied children are forked by one
/// thread that never exits.
fn spawn_from_long_lived_thread(command: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnJob>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        thread::Builder::new()
            .name("tessera-e2e-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("spawn the process-spawner thread");
        tx
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner
        .send((command, reply_tx))
        .map_err(|_| io::Error::other("process-spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("process-spawner thread is gone"))?
}
