//! The embedded defaults: the bottom layer of every configuration, as TOML.

/// The defaults (docs/reference.md#configuration); the bottom layer of every configuration.
pub const DEFAULTS: &str = r#"
[gateway]
state_dir = "/var/lib/tidemark"
commit_interval_ms = 1000
tick_interval_ms = 200

[broker]
embedded = false
listen = "127.0.0.1:1883"
allow_remote = false

[source]
url = "mqtt://127.0.0.1:1883"
protocol = "v5"
client_id = ""
username = ""
password_file = ""
ca_file = ""
cert_file = ""
key_file = ""
session_expiry_s = 604800
keep_alive_s = 30
qos = 1
topics = ["sensors/+/+/+"]
topic_pattern = "sensors/{group}/{device}/{kind}"
probe_after_ms = 1000
probe_timeout_ms = 3000
probe_topic = "tidemark/{gateway}/probe"

[payload]
format = "auto"
timestamp_field = "ts"
timestamp_unit = "auto"
seq_field = "seq"

[time]
policy = "calibrated"
min_valid_epoch_ms = 1577836800000
invalid = "arrival"
max_skew_ms = 300000
skew_window = 32
max_future_ms = 5000
max_age_ms = 86400000
gateway_clock = "auto"

[group_defaults]
out_of_orderness_ms = 2000
idle_timeout_ms = 30000
heartbeat_timeout_ms = 60000
allowed_lateness_ms = 30000
adaptive = { quantile = 0.999, min_ms = 100, max_ms = 600000, horizon_s = 900 }

[sink]
url = "mqtt://127.0.0.1:1883"
protocol = "v5"
client_id = ""
username = ""
password_file = ""
ca_file = ""
cert_file = ""
key_file = ""
keep_alive_s = 30
qos = 1
topic_prefix = "tidemark/{gateway}"
format = "json"
outbox_max_messages = 1000000
outbox_max_mb = 0
max_inflight = 4096
ack_timeout_ms = 5000
plain = true

[sink.sparkplug]
enabled = false
group_id = "tidemark"
edge_node_id = ""
primary_host_id = ""
rebirth_min_interval_ms = 5000

[metrics]
interval_s = 10
listen = ""
health_timeout_s = 60
token_file = ""

[log]
level = "info"
format = "text"

[sparkplug]
enabled = false
group_ids = []
host_id = ""
rebirth = true
max_edge_nodes = 4096

[fleet]
enabled = false
trusted_keys = []
confirm_s = 60
accept_v1 = false

[standby]
enabled = false
node = ""
takeover_s = 10
key_file = ""
max_frame_mib = 16
"#;
