//! Model code shared by serving and training: GGUF loading, an owned Llama/Qwen2/Qwen3 forward with
//! unmerged LoRA adapters, PEFT adapter I/O, a byte-level BPE tokenizer, the ChatML template and
//! sampling.
//!
//! We own the forward instead of using candle-transformers because its quantized models return only
//! the last position's logits, cannot take adapters and keep their KV cache inside the weights
//! (see `shared/specs/candle-notes.md`). Here weights are immutable and shared (`Arc`), while each
//! request owns its [`KvCache`] and names the adapter set it started with.

pub mod base;
pub mod chat;
pub mod generate;
pub mod gguf;
pub mod huge_pages;
pub mod lora;
pub mod q8;
pub mod spin_pool;
pub mod tokenizer;
pub mod transformer;

pub use base::{Base, BaseCache, Requantize};
pub use chat::{ChatFamily, ChatMessage, ChatPrompt, ChatTemplate, Role, encode_chat, render_chat};
pub use generate::{
    CachedPrefix, GenerateConfig, GenerateOutput, Sampler, StopReason, TokenEvent, generate,
    generate_on_gpu, generate_reusing, reusable_positions,
};
pub use gguf::{Arch, GgufFile, ModelConfig, TinySpec, write_tiny_model};
pub use lora::{AdapterRegistry, LoraConfig, LoraPair, LoraSet, LoraTarget};
pub use tokenizer::Tokenizer;

/// Sets the two thread counts candle reads from the environment, each only where the user has not set it.
///
/// - `CANDLE_NUM_THREADS=1`: candle's element-wise ops run on the thread that calls them. candle 0.11
///   spreads them over its own pool of `RAYON_NUM_THREADS - 1` workers that spin 25,000 rounds after every op
///   before parking; hearth's parallel work (the int8 kernels, `train_ops`, the decode spin pool) runs on rayon's
///   threads, so those spinning workers take cores from it and slow training down. candle's matmuls keep
///   using rayon.
/// - `RAYON_NUM_THREADS` = the available parallelism, the count rayon sizes its global pool by anyway: candle
///   asks for a thread count at every matmul, and without the variable it gets it from
///   `num_cpus::get_physical()`, which opens and parses `/proc/cpuinfo` each time.
///
/// Sets environment variables, so it must run before any other thread starts (first thing in `main`).
pub fn configure_candle_threads() {
    // SAFETY (both `set_var`s): the caller runs this before any other thread exists, so nothing reads the
    // environment concurrently.
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    }
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        unsafe { std::env::set_var("RAYON_NUM_THREADS", threads.to_string()) };
    }
}
pub use transformer::{
    DeviceStatus, GpuDecoder, GpuModel, GpuTrainer, KvCache, KvPrecision, MAX_POSITIONS,
    PairGradient, QLinear, Targets, Transformer,
};

/// Everything that can go wrong loading or running a model. Variants name the file, key or tensor
/// so that a bad download is diagnosable without a debugger.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("io error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid GGUF {path}: {reason}")]
    Gguf { path: String, reason: String },
    #[error("GGUF metadata key `{key}` is missing")]
    MissingKey { key: String },
    #[error("GGUF metadata key `{key}`: {reason}")]
    BadKey { key: String, reason: String },
    #[error("tensor `{name}` is missing")]
    MissingTensor { name: String },
    #[error("tensor `{name}`: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("unsupported architecture `{0}` (supported: llama, qwen2, qwen3, phi3, gemma3)")]
    UnsupportedArch(String),
    #[error("adapter: {0}")]
    Adapter(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(#[source] Box<minijinja::Error>),
    #[error("invalid input: {0}")]
    Input(String),
    #[error("generation: {0}")]
    Generate(String),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    #[error(transparent)]
    Kernel(#[from] q8::Q8Error),
    #[error("gpu: {0}")]
    Gpu(#[from] crate::gpu::GpuError),
}

/// Result alias for the model module.
pub type Result<T> = std::result::Result<T, ModelError>;

pub(crate) fn io_err(path: &std::path::Path, source: std::io::Error) -> ModelError {
    ModelError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Opens a GGUF once and builds both the model and its tokenizer.
pub fn load(path: impl AsRef<std::path::Path>) -> Result<(Transformer, Tokenizer)> {
    let mut g = gguf::GgufFile::open(path)?;
    let tok = Tokenizer::from_gguf_metadata(g.metadata())?;
    let model = Transformer::from_gguf_file(&mut g)?;
    Ok((model, tok))
}
