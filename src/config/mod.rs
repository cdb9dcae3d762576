//! Configuration: embedded defaults < TOML file < `TIDEMARK__SECTION__KEY` env,
//! deserialized strictly (unknown keys are errors) and validated once into a
//! typed [`Config`]. Every problem is reported as one line naming its key.

mod checks;
mod conditions;
mod databases;
mod fleet;
mod gateway;
mod load;
mod raw;
mod reload;
mod sink;
mod source;
mod standby;
mod validate;
mod whole;

pub use databases::{DbAddress, Influx, InfluxApi, Postgres, RawInflux, RawPostgres};
pub use fleet::{Fleet, RawFleet};
pub use gateway::{
    Broker, Gateway, Log, LogFormat, Metrics, RawBroker, RawGateway, RawLog, RawMetrics,
};
pub use raw::{
    MAX_SKEW_WINDOW, MsOrAuto, RawAdaptive, RawGroupDefaults, RawGroupOverride, RawPayload,
    RawSparkplug, RawTime, RawWindow, WindowKind,
};
pub use sink::{OutboxBounds, RawSink, RawSinkSparkplug, Sink};
pub use source::{HostState, Probe, Protocol, RawSource, Source};
pub use whole::{Config, ConfigError, RawConfig, readable_by_others};
// Domain types live by the code that uses them; the config only builds them.
pub use crate::codec::{PayloadConfig, PayloadFormat, TimestampUnit};
pub use crate::engine::{EngineConfig, GroupConfig, GroupRules};
pub use crate::output::SinkFormat;
pub use crate::sparkplug::SparkplugConfig;
pub use crate::time::window::WindowSpec;
pub use crate::time::{InvalidPolicy, TimeConfig, TimePolicy};
pub use checks::{Endpoint, parse_url};
pub use load::{
    REMOTE, annotate_sources, load, load_gateway, load_str, load_with_env, load_with_remote,
    over_remote,
};
pub use reload::engine_from_record;
pub use standby::{RawStandby, Standby};
