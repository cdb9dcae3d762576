//! tidemark: an event-time edge gateway.
//!
//! Layout:
//! - [`config`]: layered configuration, validated once into a typed [`config::Config`].
//! - [`model`]: ids and small value types; [`topic`]: topic pattern matching;
//!   [`codec`]: JSON/CBOR payload decoding. All pure; bad input is a value.
//! - [`time`]: clock-offset estimation, duplicate suppression, windows (pure).
//! - [`engine`]: ties them together per docs/reference.md#time; returns [`output::Output`]s.
//! - [`driver`]: the clock-free driving loop (ticks, commit cadence, batches) that
//!   `run`, `replay` and the tests share.
//! - [`replay`]: drives the engine from a recorded capture on a virtual clock.
//! - [`store`]: redb state and outbox: group commit, restore, inspect.
//! - [`fleet`]: signed remote configuration: keys, documents, the remote layer file.
//! - [`run`]: the gateway over MQTT: its components on tokio, wired by channels.
//! - [`sys`]: the edges to the operating system: the clocks (the only reads),
//!   MQTT links (rumqttc), the embedded broker, memory.
//! - [`tools`]: the other commands' bodies (capture, simulate, demo, status, fleet),
//!   each a client of its own (tokio, rumqttc, hyper).

pub mod codec;
pub mod config;
pub mod driver;
pub mod engine;
pub mod fleet;
pub mod fuzzing;
pub mod hint;
pub mod journal;
pub mod model;
pub mod output;
pub mod pair;
pub mod replay;
pub mod run;
pub mod scan;
pub mod sim;
pub mod sparkplug;
pub mod store;
pub mod sys;
pub mod time;
pub mod tools;
pub mod topic;
