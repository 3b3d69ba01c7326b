//! Rust core of trioqueue.
//!
//! The logic lives in plain Rust modules that do not depend on PyO3
//! ([`codec`], [`events`], [`state`], [`mpmc`], [`resp`]); the `python` feature adds the thin
//! binding layer that maturin builds into `trioqueue._core`.

#![deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
#![cfg_attr(
    test,
    allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

pub mod codec;
pub mod events;
pub mod mpmc;
pub mod resp;
pub mod state;

#[cfg(feature = "python")]
mod python;
