//! Saving a delta: PEFT adapter files plus `provenance.json`, written into a temporary directory
//! and renamed into place, so a reader never sees half a delta.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Result, TrainConfig, io_err};
use crate::message::Delta;
use crate::model::{LoraSet, ModelConfig};

/// What binds a delta to its inputs: the base it adapts, the full recipe, the data in order,
/// its parent delta, the seed, and what training measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    pub delta_id: String,
    pub base_sha256: String,
    /// SHA-256 of the serialized [`TrainConfig`] (`recipe` below).
    pub recipe_sha256: String,
    pub recipe: TrainConfig,
    pub data_digest: String,
    pub num_samples: usize,
    pub parent: Option<String>,
    pub seed: u64,
    pub metrics: serde_json::Value,
    pub created_at_unix_ms: u64,
}

/// The llama.cpp GGUF LoRA export written beside the PEFT files of every delta.
pub const GGUF_FILE: &str = "adapter.gguf";

pub use crate::files::{hex, sha256_hex};

/// SHA-256 of a file, streamed (a base model can be gigabytes).
pub fn sha256_file(path: &Path) -> Result<String> {
    crate::files::sha256_file(path).map_err(|e| io_err(path, e))
}

/// SHA-256 of the recipe as serialized JSON.
pub fn recipe_sha256(cfg: &TrainConfig) -> Result<String> {
    Ok(sha256_hex(&serde_json::to_vec(cfg)?))
}

/// A delta's id: `delta-` + the first 16 hex of the SHA-256 of its `adapter_model.safetensors` bytes.
pub fn delta_id(safetensors: &[u8]) -> String {
    format!("delta-{}", &sha256_hex(safetensors)[..16])
}

/// A fresh staging directory under `root` for a delta being written (see [`publish_delta`]).
pub fn staging_dir(root: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(root).map_err(|e| io_err(root, e))?;
    let tmp = root.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        crate::clock::now_unix_ms()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| io_err(&tmp, e))?;
    Ok(tmp)
}

/// Publishes the delta written into `tmp` as `root/<provenance.delta_id>`: writes `provenance.json`, syncs every
/// file, and renames the directory into place, so a reader never sees half a delta. Identical bytes already
/// published (a rerun) are kept and ours dropped. Returns the [`Delta`] message.
pub fn publish_delta(root: &Path, tmp: &Path, provenance: &Provenance) -> Result<Delta> {
    publish_delta_with(root, tmp, provenance, &serde_json::Map::new())
}

/// [`publish_delta`] with `extra` keys written into `provenance.json` beside the [`Provenance`] fields: `user`
/// (whose own delta it is), `trained_on` and `members` (see [`crate::store::TRAINED_ON`], [`crate::store::MEMBERS`]).
fn publish_delta_with(
    root: &Path,
    tmp: &Path,
    provenance: &Provenance,
    extra: &serde_json::Map<String, serde_json::Value>,
) -> Result<Delta> {
    let prov_path = tmp.join("provenance.json");
    let mut json = serde_json::to_value(provenance)?;
    for (k, v) in extra {
        json[k.as_str()] = v.clone();
    }
    std::fs::write(&prov_path, serde_json::to_vec_pretty(&json)?)
        .map_err(|e| io_err(&prov_path, e))?;
    for entry in std::fs::read_dir(tmp).map_err(|e| io_err(tmp, e))? {
        let p = entry.map_err(|e| io_err(tmp, e))?.path();
        std::fs::File::open(&p)
            .and_then(|f| f.sync_all())
            .map_err(|e| io_err(&p, e))?;
    }
    let dest = root.join(&provenance.delta_id);
    if dest.exists() {
        let _ = std::fs::remove_dir_all(tmp);
    } else {
        std::fs::rename(tmp, &dest).map_err(|e| io_err(&dest, e))?;
        if let Ok(d) = std::fs::File::open(root) {
            let _ = d.sync_all();
        }
    }
    Ok(Delta {
        id: provenance.delta_id.clone(),
        path: dest.display().to_string(),
        base_sha256: provenance.base_sha256.clone(),
        recipe_sha256: provenance.recipe_sha256.clone(),
        data_digest: provenance.data_digest.clone(),
        parent: provenance.parent.clone(),
    })
}

/// Writes `adapter` under `root/<id>/` (id: [`delta_id`]) with its llama.cpp GGUF export (not for DoRA, which
/// llama.cpp cannot load) and `provenance.json`, atomically, and returns the [`Delta`] message. The caller fills
/// `provenance` except `delta_id`.
pub fn save_delta(
    root: &Path,
    adapter: &LoraSet,
    model: &ModelConfig,
    provenance: Provenance,
) -> Result<Delta> {
    save_delta_for(root, adapter, model, provenance, None)
}

/// [`save_delta`] for one user's own delta (`None`: the common delta); the user is kept in `provenance.json`.
pub fn save_delta_for(
    root: &Path,
    adapter: &LoraSet,
    model: &ModelConfig,
    provenance: Provenance,
    user: Option<&str>,
) -> Result<Delta> {
    let mut extra = serde_json::Map::new();
    if let Some(u) = user {
        extra.insert("user".into(), u.into());
    }
    save_delta_with(root, adapter, model, provenance, &extra)
}

/// [`save_delta`] with `extra` keys in `provenance.json` (see [`publish_delta_with`]).
pub fn save_delta_with(
    root: &Path,
    adapter: &LoraSet,
    model: &ModelConfig,
    mut provenance: Provenance,
    extra: &serde_json::Map<String, serde_json::Value>,
) -> Result<Delta> {
    let tmp = staging_dir(root)?;
    adapter.save_peft(&tmp, model)?;
    let st = tmp.join("adapter_model.safetensors");
    let bytes = std::fs::read(&st).map_err(|e| io_err(&st, e))?;
    provenance.delta_id = delta_id(&bytes);
    // The same adapter for llama.cpp (`--lora adapter.gguf`).
    if !adapter.config.use_dora {
        adapter.save_gguf(tmp.join(GGUF_FILE), model)?;
    }
    publish_delta_with(root, &tmp, &provenance, extra)
}

/// The user a delta directory's `provenance.json` names as its owner; `None`: a common delta (or an adapter
/// without provenance, which no trainer made for a user).
pub fn delta_user(dir: &Path) -> Result<Option<String>> {
    let path = dir.join("provenance.json");
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(&path, e)),
    };
    let json: serde_json::Value = serde_json::from_slice(&bytes)?;
    Ok(json.get("user").and_then(|u| u.as_str()).map(str::to_owned))
}
