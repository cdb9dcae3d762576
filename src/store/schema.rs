//! The redb schema, in one place. Values are CBOR; keys fixed-width or tuples.
//!
//! Version history:
//! - 1: meta, groups, devices, metric_names, outbox. `meta.wal_generation` (added
//!   later, compatible) names the journal generation that follows the checkpoint.

use redb::TableDefinition;

/// Bumped on any incompatible change of a table or value encoding.
pub const SCHEMA_VERSION: u32 = 1;

/// Small singletons: schema version, counters, outbox cursor, replay position.
pub const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// Group watermark state by group id.
pub const GROUPS: TableDefinition<&str, &[u8]> = TableDefinition::new("groups");
/// Device state (clock estimator, liveness, seq window, open windows) by (group, device).
pub const DEVICES: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("devices");
/// Interned metric names by index.
pub const METRIC_NAMES: TableDefinition<u16, &str> = TableDefinition::new("metric_names");
/// Outputs awaiting delivery, FIFO by sequence number.
pub const OUTBOX: TableDefinition<u64, &[u8]> = TableDefinition::new("outbox");

/// The outbox numbers of reports (rejected and late data), oldest first: their
/// share of the outbox bound (added later, compatible: absent = none).
pub const OUTBOX_REPORTS: TableDefinition<u64, ()> = TableDefinition::new("outbox_reports");

/// `META` key of the schema version (u32, big-endian).
pub const K_SCHEMA: &str = "schema_version";
/// `META` key of the engine counters.
pub const K_COUNTERS: &str = "counters";
/// `META` key of the gateway-clock judgement (added later, compatible: absent = none yet).
pub const K_CLOCK: &str = "gateway_clock";
/// `META` key prefix of Sparkplug edge nodes: `sparkplug/{group}/{edge_node}` (added later, compatible).
pub const K_SPARKPLUG: &str = "sparkplug/";
/// `META` key of the outbox cursor and drop count.
pub const K_OUTBOX: &str = "outbox";
/// `META` key of the engine settings in force at the checkpoint (an
/// `EngineConfig::record`, or before 2026-12 a TOML document; added later,
/// compatible: absent = the configured ones).
pub const K_RULES: &str = "engine_rules";
/// `META` key of the highest remote document id taken (u64, big-endian; added later,
/// compatible: absent = none). Kept here so a lost `remote.toml` never lowers it.
pub const K_FLEET_ID: &str = "fleet_last_id";
/// `META` key of the Sparkplug edge node's next session counter (`bdSeq` = it mod 256;
/// u64, big-endian; added later, compatible: absent = 0). A standby that takes over
/// goes on from it.
pub const K_BD_SEQ: &str = "sparkplug_bd_seq";
/// `META` key of the write-ahead journal generation its records must carry (u64, big-endian).
pub const K_WAL: &str = "wal_generation";

/// A stored schema version (`K_SCHEMA`'s value; u32::MAX when unreadable).
pub fn version_of(bytes: &[u8]) -> u32 {
    <[u8; 4]>::try_from(bytes).map_or(u32::MAX, u32::from_be_bytes)
}

/// This build's schema version as stored.
pub fn version_bytes() -> [u8; 4] {
    SCHEMA_VERSION.to_be_bytes()
}

/// The engine settings in force at the last checkpoint, if recorded.
pub fn rules_doc(meta: &std::collections::BTreeMap<String, Vec<u8>>) -> Option<Vec<u8>> {
    meta.get(K_RULES).cloned()
}

/// The highest remote document id taken, as stored (0: none).
pub fn fleet_last_id(meta: &std::collections::BTreeMap<String, Vec<u8>>) -> u64 {
    meta.get(K_FLEET_ID)
        .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
        .map_or(0, u64::from_be_bytes)
}

/// The edge node's next session counter, as stored (0: none).
pub fn bd_seq(meta: &std::collections::BTreeMap<String, Vec<u8>>) -> u64 {
    meta.get(K_BD_SEQ)
        .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
        .map_or(0, u64::from_be_bytes)
}

/// `META` key prefix of an output's cursor and totals (`output/postgres`: CBOR of a
/// [`crate::model::OutputMark`]; added later, compatible: absent = none).
pub const K_OUTPUT: &str = "output/";

/// Every output's cursor and totals, as stored (zero: none).
pub fn output_marks(
    meta: &std::collections::BTreeMap<String, Vec<u8>>,
) -> Vec<(crate::model::OutputKind, crate::model::OutputMark)> {
    crate::model::OutputKind::ALL
        .iter()
        .filter_map(|o| {
            let b = meta.get(&format!("{K_OUTPUT}{}", o.as_str()))?;
            Some((*o, ciborium::de::from_reader(b.as_slice()).ok()?))
        })
        .collect()
}

/// The journal generation named by the last checkpoint (0: none yet).
pub fn wal_generation(meta: &std::collections::BTreeMap<String, Vec<u8>>) -> u64 {
    meta.get(K_WAL)
        .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
        .map_or(0, u64::from_be_bytes)
}
