//! The state dir opened and the engine brought to the last commit, under the
//! rules each journaled message arrived with.

use crate::config::Config;
use crate::driver::Driver;
use crate::engine::Engine;
use crate::run::error::RunError;
use crate::store::Store;
use crate::sys::clock::SystemClock;

/// The state restored from disk, ready to drive.
pub struct Restored {
    /// The store and its journal.
    pub durable: crate::run::durable::Durable,
    /// The engine at the last commit.
    pub driver: Driver,
    /// Outbox entries waiting.
    pub outbox_depth: u64,
    /// Outputs dropped so far.
    pub outbox_dropped: u64,
}

/// The state dir opened and the engine brought to the last commit, exactly as
/// written: the checkpoint, then the journal. Returns the engine settings in
/// force after the journal.
pub fn open_state(
    cfg: &Config,
) -> Result<(crate::run::durable::Durable, Engine, Vec<u8>), RunError> {
    let (mut store, snap) =
        Store::open_streaming(&cfg.gateway.state_dir, cfg.sink.outbox.messages)?;
    store.set_max_bytes(cfg.sink.outbox.bytes);
    let (groups, devices) = (snap.groups.len(), snap.device_count);
    let doc = crate::store::schema::rules_doc(&snap.meta);
    let at_checkpoint = doc.as_deref().map(crate::config::engine_from_record);
    let mut engine = match at_checkpoint {
        Some(Ok(rules)) => Engine::new(&rules),
        Some(Err(e)) => {
            tracing::warn!(error = %e, "the rules recorded with the state do not validate; starting with the configured ones");
            Engine::new(&cfg.engine)
        }
        None => Engine::new(&cfg.engine),
    };
    engine.restore_groups(
        snap.groups,
        snap.metric_names,
        snap.counters,
        usize::try_from(devices).unwrap_or(0),
    );
    store.read_devices(|d| engine.restore_device(d))?;
    engine.restored();
    engine.restore_clock(snap.gateway_clock);
    engine.take_fleet_id(crate::store::schema::fleet_last_id(&snap.meta));
    engine.take_bd_seq(crate::store::schema::bd_seq(&snap.meta));
    for (o, mark) in crate::store::schema::output_marks(&snap.meta) {
        engine.take_output_mark(o, mark);
    }
    engine.restore_sparkplug(snap.sparkplug);
    // What the journal holds since the last checkpoint goes into the engine and the state file.
    let configured = cfg.engine.record();
    let (durable, replayed, in_force) = crate::run::durable::Durable::recover(
        store,
        &cfg.gateway.state_dir,
        &snap.meta,
        &mut engine,
        &configured,
    )?;
    tracing::info!(
        state = %durable.store().path().display(),
        groups,
        devices,
        journal_records = replayed,
        "state restored"
    );
    Ok((durable, engine, in_force))
}

/// Opens the state dir and brings the engine to the last commit (blocking I/O),
/// under the rules each journaled message arrived with; then `cfg`'s rules, if
/// they differ, as a reload would apply them.
pub fn restore(cfg: &Config, clock: SystemClock) -> Result<Restored, RunError> {
    let (durable, engine, in_force) = open_state(cfg)?;
    let outbox_depth = durable.store().outbox_depth()?;
    let outbox_dropped = durable.store().outbox_dropped();
    let mut driver = Driver::new(
        engine,
        &cfg.gateway,
        &cfg.sink.prefix,
        cfg.sink.format,
        None,
    )
    .with_journal();
    // This process's monotonic clock starts afresh: the last reference of wall − mono is void.
    driver.new_clock_origin();
    // Rebirth requests recomputed from the journal were sent (or not) by the last process.
    driver.engine_mut().take_commands();
    match crate::config::engine_from_record(&in_force) {
        Ok(rules) if rules == cfg.engine => driver.set_rules(&rules),
        Ok(rules) => {
            tracing::info!("the rules changed since the state was written: applied as a reload");
            driver.set_rules(&rules);
            driver.reconfigure(clock.now(), cfg);
        }
        Err(e) => {
            tracing::warn!(error = %e, "the rules in force after the journal do not validate; the configured ones apply");
            driver.reconfigure(clock.now(), cfg);
        }
    }
    Ok(Restored {
        durable,
        driver,
        outbox_depth,
        outbox_dropped,
    })
}
