//! A fake MPS control daemon for nodes without GPUs (the fake backend).
//!
//! It lives in the agent, one thread per GPU, listening on the socket
//! `<pipe dir>/control` where clients find the real one, and answers the
//! control commands of `nvidia-cuda-mps-control` that the agent and a
//! curious container use: `get_server_list`, `start_server -uid <uid>`,
//! `get/set_default_active_thread_percentage`,
//! `get/set_default_device_pinned_mem_limit` and `quit`. It logs to
//! `<log dir>/control.log` as the real daemon does. Like the real one, it
//! is reached only through its pipe directory.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read, Write},
    os::unix::net::{UnixListener, UnixStream},
    path::Path,
    time::Duration,
};

use super::daemon::{MpsControl, MpsDaemon};
use crate::Error;

/// The daemon's socket in its pipe directory.
pub const SOCKET: &str = "control";
/// The daemon's log in its log directory.
pub const LOG: &str = "control.log";
/// How long a connection may take to send its command.
const READ_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest command line read.
const MAX_LINE: u64 = 256;

/// Starts fake daemons; commands them through their sockets.
#[derive(Clone, Debug, Default)]
pub struct FakeControl;

impl MpsControl for FakeControl {
    fn start(&self, daemon: &MpsDaemon) -> Result<(), Error> {
        let socket = daemon.pipe_dir.join(SOCKET);
        // A socket left by a daemon that went with the last agent.
        match std::fs::remove_file(&socket) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("removing {}", socket.display()))(e)),
        }
        let listener = UnixListener::bind(&socket)
            .map_err(Error::io(format!("listening on {}", socket.display())))?;
        let state = State {
            log: daemon.log_dir.join(LOG),
            ..State::default()
        };
        state.log("Control daemon started");
        std::thread::Builder::new()
            .name(format!("fake-mps-{}", daemon.uuid))
            .spawn(move || serve(&listener, &socket, state))
            .map_err(Error::io("starting the fake MPS daemon's thread"))?;
        Ok(())
    }

    fn command(&self, daemon: &MpsDaemon, command: &str) -> Result<String, Error> {
        let socket = daemon.pipe_dir.join(SOCKET);
        let failed = |e: std::io::Error| Error::Mps(format!("{}: {e}", socket.display()));
        let mut stream = UnixStream::connect(&socket).map_err(failed)?;
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(failed)?;
        stream
            .write_all(format!("{command}\n").as_bytes())
            .map_err(failed)?;
        stream.shutdown(std::net::Shutdown::Write).map_err(failed)?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).map_err(failed)?;
        Ok(answer)
    }
}

/// What the daemon remembers.
#[derive(Debug, Default)]
struct State {
    log: std::path::PathBuf,
    /// `set_default_active_thread_percentage`; 100 when unset.
    thread_percentage: Option<f64>,
    /// `set_default_device_pinned_mem_limit`, per device.
    pinned: BTreeMap<String, String>,
    /// Servers started, as (uid, pid).
    servers: Vec<(u32, u32)>,
}

impl State {
    fn log(&self, line: &str) {
        let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
        else {
            return;
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let _ = writeln!(file, "[{now}] {line}");
    }

    /// The answer to one command line, and whether the daemon quits.
    fn answer(&mut self, line: &str) -> (String, bool) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match words.as_slice() {
            ["quit"] => {
                self.log("Control daemon exited");
                return (String::new(), true);
            }
            ["get_server_list"] => self
                .servers
                .iter()
                .map(|(_, pid)| format!("{pid}\n"))
                .collect(),
            ["start_server", "-uid", uid] => match uid.parse::<u32>() {
                Ok(uid) => {
                    let pid = self
                        .servers
                        .iter()
                        .find(|(u, _)| *u == uid)
                        .map_or(40_000 + self.servers.len() as u32, |(_, pid)| *pid);
                    if !self.servers.iter().any(|(u, _)| *u == uid) {
                        self.servers.push((uid, pid));
                        self.log(&format!("Starting new server {pid} for user {uid}"));
                    }
                    String::new()
                }
                Err(_) => format!("Invalid user id {uid}\n"),
            },
            ["get_default_active_thread_percentage"] => {
                format!("{:.1}\n", self.thread_percentage.unwrap_or(100.0))
            }
            ["set_default_active_thread_percentage", value] => match value.parse::<f64>() {
                Ok(p) if p > 0.0 && p <= 100.0 => {
                    self.thread_percentage = Some(p);
                    format!("{p:.1}\n")
                }
                _ => format!("Invalid active thread percentage {value}\n"),
            },
            ["get_default_device_pinned_mem_limit", device] => {
                format!("{}\n", self.pinned.get(*device).map_or("0", String::as_str))
            }
            ["set_default_device_pinned_mem_limit", device, value] => {
                self.pinned
                    .insert((*device).to_owned(), (*value).to_owned());
                String::new()
            }
            _ => format!("Unrecognized command: {line}\n"),
        };
        self.log(&format!("Control command: {line}"));
        (answer, false)
    }
}

/// Answers one connection at a time until `quit`. A client that sends
/// nothing is dropped after [`READ_TIMEOUT`], so none can stall the daemon.
fn serve(listener: &UnixListener, socket: &Path, mut state: State) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        if stream.set_read_timeout(Some(READ_TIMEOUT)).is_err() {
            continue;
        }
        let mut reader = BufReader::new(stream.take(MAX_LINE * 16));
        let mut quit = false;
        let mut out = String::new();
        let mut line = String::new();
        while !quit {
            line.clear();
            match reader.by_ref().take(MAX_LINE).read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let command = line.trim();
            if command.is_empty() {
                continue;
            }
            let (answer, stop) = state.answer(command);
            out.push_str(&answer);
            quit = stop;
        }
        let mut stream = reader.into_inner().into_inner();
        let _ = stream.write_all(out.as_bytes());
        if quit {
            let _ = std::fs::remove_file(socket);
            return;
        }
    }
}
