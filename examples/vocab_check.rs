//! Tokenizes llama.cpp's tokenizer test inputs with hearth and compares the ids with llama.cpp's expected ones:
//! `cargo run --release --example vocab_check -- VOCAB.gguf...` reads `VOCAB.gguf.inp` (strings separated by
//! `__ggml_vocab_test__` lines) and `VOCAB.gguf.out` (llama.cpp's ids, one line per string) beside each file, as
//! the llama.cpp source tree ships them under `models/` (`scripts/vocab_check.sh` runs it on the copy that
//! `scripts/llamacpp_build.sh` unpacks). Prints agreement per vocabulary and the first differences, or why hearth
//! refuses it; exits 1 when any string of a vocabulary hearth takes differs.

use std::path::Path;
use std::process::ExitCode;

use hearth::model::{GgufFile, Tokenizer};

const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

/// Strings and how many of them differ, or `None` where hearth refuses the vocabulary (and says why).
fn check(path: &Path) -> Result<Option<(usize, usize)>, String> {
    let with = |ext: &str| {
        let mut p = path.as_os_str().to_owned();
        p.push(ext);
        std::fs::read_to_string(&p).map_err(|e| format!("{}{ext}: {e}", path.display()))
    };
    let (inp, out) = (with(".inp")?, with(".out")?);
    let gguf = GgufFile::open(path).map_err(|e| e.to_string())?;
    let tok = match Tokenizer::from_gguf_metadata(gguf.metadata()) {
        Ok(tok) => tok,
        Err(e) => {
            println!("{}: refused: {e}", path.display());
            return Ok(None);
        }
    };
    let texts: Vec<&str> = inp
        .strip_suffix(SEPARATOR)
        .unwrap_or(&inp)
        .split(SEPARATOR)
        .collect();
    let expected: Vec<&str> = out.lines().collect();
    if texts.len() != expected.len() {
        return Err(format!(
            "{}: {} strings but {} id lines",
            path.display(),
            texts.len(),
            expected.len()
        ));
    }
    let mut differ = 0;
    for (i, (text, line)) in texts.iter().zip(&expected).enumerate() {
        let want: Vec<u32> = line
            .split_whitespace()
            .map(|v| {
                v.parse()
                    .map_err(|e| format!("{}.out:{}: {e}", path.display(), i + 1))
            })
            .collect::<Result<_, _>>()?;
        let got = tok.encode(text, false).map_err(|e| e.to_string())?;
        if got != want {
            differ += 1;
            if differ <= 3 {
                // From the first id that differs, a few of each, and the text those of llama.cpp's before it cover.
                let at = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
                let before = tok.decode(&want[..at], false);
                let tail = |v: &[u32]| v[at..].iter().take(6).copied().collect::<Vec<_>>();
                println!(
                    "  string {}: from id {at} (after {:?}): hearth {:?}, llama.cpp {:?}",
                    i + 1,
                    before
                        .chars()
                        .rev()
                        .take(20)
                        .collect::<String>()
                        .chars()
                        .rev()
                        .collect::<String>(),
                    tail(&got),
                    tail(&want),
                );
                println!(
                    "    text there: {:?}",
                    text.get(before.len()..)
                        .map(|t| t.chars().take(20).collect::<String>())
                );
            }
        }
    }
    Ok(Some((texts.len(), differ)))
}

fn main() -> ExitCode {
    let paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.is_empty() {
        eprintln!("usage: vocab_check VOCAB.gguf...");
        return ExitCode::from(2);
    }
    let mut failed = false;
    for p in &paths {
        match check(Path::new(p)) {
            Ok(None) => {}
            Ok(Some((n, differ))) => {
                println!("{p}: {} of {n} strings give llama.cpp's ids", n - differ);
                failed |= differ > 0;
            }
            Err(e) => {
                println!("{p}: not checked: {e}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
