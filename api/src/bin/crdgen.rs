//! Writes Tessera's CRDs as YAML files: `tessera-crdgen <DIR>` (`make crds`).
//!
//! Files in DIR that are not generated CRDs are left alone; stale generated
//! files (a renamed CRD) are removed.

#![forbid(unsafe_code)]

use std::{fs, path::PathBuf, process::ExitCode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir] = args.as_slice() else {
        eprintln!(
            "usage: tessera-crdgen <DIR>\nwrites every Tessera CRD as <DIR>/<plural>.<group>.yaml"
        );
        return ExitCode::from(2);
    };
    match run(PathBuf::from(dir)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tessera-crdgen: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run(dir: PathBuf) -> Result<(), Box<dyn std::error::Error>> {
    let files = tessera_api::crds::render()?;
    fs::create_dir_all(&dir)?;
    for entry in fs::read_dir(&dir)? {
        let path = entry?.path();
        let generated =
            fs::read_to_string(&path).is_ok_and(|text| text.starts_with(tessera_api::crds::HEADER));
        let current = files
            .iter()
            .any(|f| path.file_name().is_some_and(|n| n == f.name.as_str()));
        if generated && !current {
            fs::remove_file(&path)?;
        }
    }
    for file in &files {
        fs::write(dir.join(&file.name), &file.contents)?;
        eprintln!("wrote {}", dir.join(&file.name).display());
    }
    Ok(())
}
