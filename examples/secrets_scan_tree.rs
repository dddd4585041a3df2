//! `secrets_scan_tree DIR...` lists secret findings in every `.rs` file under the given directories: the
//! false-positive check of the secret filter on real source code (this repository, the cargo registry).

use std::path::Path;
use std::process::ExitCode;

use hearth::curate::secrets::{SecretConfig, SecretScanner};

fn scan_tree(
    scanner: &SecretScanner,
    dir: &Path,
    files: &mut usize,
    bytes: &mut usize,
    hits: &mut Vec<String>,
) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            scan_tree(scanner, &p, files, bytes, hits);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let Ok(text) = std::fs::read_to_string(&p) else {
                continue;
            };
            *files += 1;
            *bytes += text.len();
            for f in scanner.scan(&text) {
                let s: String = text
                    .chars()
                    .skip(f.start)
                    .take((f.end - f.start).min(60))
                    .collect();
                hits.push(format!(
                    "{}\t{}\t{}",
                    p.display(),
                    f.rule,
                    s.replace('\n', "\\n")
                ));
            }
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let run = || -> Result<(), Box<dyn std::error::Error>> {
        match args.get(1).map(String::as_str) {
            Some(_) => {
                let s = SecretScanner::new(SecretConfig::default())?;
                let (mut files, mut bytes, mut hits) = (0, 0, Vec::new());
                for d in &args[1..] {
                    scan_tree(&s, Path::new(d), &mut files, &mut bytes, &mut hits);
                }
                for h in &hits {
                    println!("{h}");
                }
                eprintln!("files {files} bytes {bytes} findings {}", hits.len());
            }
            _ => {
                return Err("usage: secrets_scan_tree DIR...".into());
            }
        }
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
