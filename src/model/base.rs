//! A base model loaded once per process and shared: serving, training and the eval gate read the same
//! weights, so a graph holds one copy of them however many nodes use the base.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::{GgufFile, Result, Tokenizer, Transformer, io_err};

/// How a base keeps its block-quantized weights at load: as the file has them, or re-encoded as Q8_0 so that
/// every product takes the Q8_0 kernels (panels where the CPU has them), at about twice a 4-bit file's
/// memory. Types without an int8 kernel of their own (Q2_K, Q3_K, Q5_0, ...) gain the most; the K-quants
/// trade memory for speed. Re-encoding moves each weight by at most half a Q8_0 step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Requantize {
    /// Keep the file's types.
    #[default]
    Off,
    /// Re-encode every block-quantized weight that is not Q8_0 as Q8_0.
    #[allow(non_camel_case_types)]
    Q8_0,
}

/// A GGUF base: weights, tokenizer (with its chat template), and the SHA-256 of the file that every
/// delta and verdict is bound to.
pub struct Base {
    pub path: PathBuf,
    pub sha256: String,
    pub model: Transformer,
    pub tok: Arc<Tokenizer>,
}

impl std::fmt::Debug for Base {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Base")
            .field("path", &self.path)
            .field("sha256", &self.sha256)
            .finish_non_exhaustive()
    }
}

impl Base {
    /// Opens the GGUF once and builds everything from it, keeping the file's weight types.
    pub fn load(path: &Path) -> Result<Base> {
        Base::load_with(path, Requantize::Off)
    }

    /// [`Base::load`], re-encoding the weights as `requantize` says. The hash stays the file's: deltas bind
    /// to the file, whatever form its weights take in memory.
    pub fn load_with(path: &Path, requantize: Requantize) -> Result<Base> {
        let sha256 = crate::files::sha256_file(path).map_err(|e| io_err(path, e))?;
        Base::load_hashed(path, sha256, requantize)
    }

    fn load_hashed(path: &Path, sha256: String, requantize: Requantize) -> Result<Base> {
        let mut g = GgufFile::open(path)?;
        let tok = Tokenizer::from_gguf_metadata(g.metadata())?;
        let model = Transformer::from_gguf_file_with(&mut g, requantize)?;
        Ok(Base {
            path: path.to_path_buf(),
            sha256,
            model,
            tok: Arc::new(tok),
        })
    }
}

/// Bases loaded so far, keyed by file, content and [`Requantize`]: a second node asking for the same file in
/// the same form gets the same weights, and a file replaced on disk (another hash) is loaded anew.
#[derive(Default)]
pub struct BaseCache {
    loaded: Mutex<HashMap<(PathBuf, String, Requantize), Arc<Base>>>,
}

impl BaseCache {
    /// The base at `path` with the file's weight types, loading it on first use.
    pub fn get(&self, path: &Path) -> Result<Arc<Base>> {
        self.get_with(path, Requantize::Off)
    }

    /// The base at `path` re-encoded as `requantize` says, loading it on first use. Loads run one at a time,
    /// so two nodes starting together never load the same file twice.
    pub fn get_with(&self, path: &Path, requantize: Requantize) -> Result<Arc<Base>> {
        let canonical = path.canonicalize().map_err(|e| io_err(path, e))?;
        // Hashed outside the lock: the hash is what tells a replaced file from the one loaded.
        let sha256 = crate::files::sha256_file(&canonical).map_err(|e| io_err(path, e))?;
        let key = (canonical, sha256, requantize);
        // A poisoned lock only means a load panicked; the map holds whole entries only.
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(base) = loaded.get(&key) {
            return Ok(base.clone());
        }
        // Graph files are checked for this (`requantize` per `model`); a file named by two spellings is not.
        if let Some((_, _, held)) = loaded
            .keys()
            .find(|(p, sha, r)| *p == key.0 && *sha == key.1 && *r != requantize)
        {
            tracing::warn!(
                model = %path.display(), ?held, ?requantize,
                "the base is loaded a second time in another form: its nodes use other weights"
            );
        }
        let base = Arc::new(Base::load_hashed(path, key.1.clone(), requantize)?);
        loaded.insert(key, base.clone());
        Ok(base)
    }

    /// How many distinct bases are loaded.
    pub fn len(&self) -> usize {
        self.loaded.lock().map(|l| l.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Arch, TinySpec, write_tiny_model};

    #[test]
    fn one_file_loads_once_and_a_replaced_file_loads_anew() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        write_tiny_model(&path, &TinySpec::new(Arch::Llama)).unwrap();
        let cache = BaseCache::default();
        let a = cache.get(&path).unwrap();
        // Another spelling of the same file is the same base.
        let b = cache.get(&dir.path().join(".").join("m.gguf")).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(cache.len(), 1);
        let mut other = TinySpec::new(Arch::Llama);
        other.seed += 1;
        write_tiny_model(&path, &other).unwrap();
        let c = cache.get(&path).unwrap();
        assert!(!Arc::ptr_eq(&a, &c));
        assert_ne!(a.sha256, c.sha256);
        assert_eq!(cache.len(), 2);
        // The same file re-encoded is another base, loaded once too.
        let d = cache.get_with(&path, Requantize::Q8_0).unwrap();
        assert!(!Arc::ptr_eq(&c, &d));
        assert!(Arc::ptr_eq(
            &d,
            &cache.get_with(&path, Requantize::Q8_0).unwrap()
        ));
        assert_eq!(cache.len(), 3);
    }
}
