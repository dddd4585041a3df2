//! What the nodes of one running graph share: one value per type, made by the first node that asks.
//!
//! The engine never looks inside; a library keeps its own cache type here (say, base models keyed by
//! path and content hash) so that several nodes using the same thing load it once.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct Resources {
    values: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

impl std::fmt::Debug for Resources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.values.lock().map(|v| v.len()).unwrap_or(0);
        f.debug_struct("Resources").field("values", &n).finish()
    }
}

impl Resources {
    /// The graph's one `T`, made with `T::default()` on first use.
    pub fn get<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        // A poisoned lock only means another node panicked while inserting; the map is still whole.
        let mut values = self.values.lock().unwrap_or_else(|p| p.into_inner());
        let value = values
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Arc::new(T::default()))
            .clone();
        drop(values);
        // The entry under T's TypeId was made as a T just above (or by an earlier call).
        value
            .downcast::<T>()
            .unwrap_or_else(|_| unreachable!("resource stored under another type's id"))
    }
}
