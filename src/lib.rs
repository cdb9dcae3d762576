//! tidemark: an event-time edge gateway.
//!
//! Layout:
//! - [`config`]: layered configuration, validated once into a typed [`config::Config`].
//! - [`model`]: ids and small value types; [`topic`]: topic pattern matching;
//!   [`codec`]: JSON/CBOR payload decoding. All pure; bad input is a value.
#![deny(clippy::all)]
#![warn(missing_docs)]

pub mod codec;
pub mod config;
pub mod model;
pub mod topic;
