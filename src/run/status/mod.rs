//! What the gateway shows of itself: the shared registry of counters and
//! health, the metrics gathered from it and the engine, and the answers of
//! `/api/v1/*` (docs/reference.md#local-http-endpoint-metricslisten).

pub mod api;
pub mod health;
pub mod metrics;
pub mod registry;
