//! Federated learning between hearth nodes: a zen/gym-compatible wire mode (for interop with the existing Python
//! control plane) and a native mode (real safetensors, PEFT names), plus what gym lacks: replay protection, quorum
//! with round timeouts, robust and exact-LoRA aggregation, differential privacy before egress, and persisted rounds.
//!
//! Layout: [`wire`] (blob formats, bf16), [`hmac_auth`] (request signing, replay cache), [`aggregate`] (robust
//! per-coordinate kernels), [`lora`] (exact ΔW aggregation + truncated SVD re-factoring, on [`linalg`]), [`dp`]
//! (clipping, Gaussian noise, RDP accountant), [`coordinator`] (actix-web server), [`client`] (blocking client) and
//! [`tls`] (rustls, optional on both sides).

pub mod aggregate;
pub mod client;
pub mod coordinator;
pub mod dp;
pub mod hmac_auth;
pub mod linalg;
pub mod lora;
pub mod tls;
pub mod wire;
pub mod worker;
pub mod worker_settings;

pub use wire::{Delta, Tensor, WireMode};
