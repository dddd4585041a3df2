//! The loops tests, in one binary: each test binary links the whole crate and its dependencies.

#[path = "../http_util/mod.rs"]
mod http_util;
#[path = "../train_util/mod.rs"]
mod train_util;

mod durability;
mod e2e;
mod per_user;
mod personal;
mod reconcile;
mod retention;
mod store;
