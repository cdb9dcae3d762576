//! The command line as clap types; each subcommand's arguments are one struct
//! its body in [`super::commands`] takes.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use tidemark::config::{LogFormat, Protocol};

#[derive(Parser)]
#[command(
    name = "tidemark",
    version,
    about = "Event-time edge gateway for MQTT sensor fleets"
)]
pub struct Cli {
    /// Log line format (overrides `[log] format`).
    #[arg(long, global = true, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Configuration file: `tidemark --config FILE` runs the gateway (repeatable, later wins).
    #[arg(long)]
    pub config: Vec<PathBuf>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the gateway until SIGTERM/SIGINT, then flush state and exit 0.
    Run(RunArgs),
    /// Validate a config and print the effective configuration (secrets masked).
    Check(CheckArgs),
    /// Run the engine on a recorded capture (JSON lines) with a virtual clock.
    Replay(ReplayArgs),
    /// Record live traffic as a replay input (JSON lines), until Ctrl-C.
    Capture(CaptureArgs),
    /// Embedded broker + simulated fleet + gateway, with a live view; Ctrl-C stops it.
    Demo(DemoArgs),
    /// Publish a synthetic fleet (seeded): skewed clocks, delays, disorder, late,
    /// duplicates, malformed messages, silent devices, an outage's backlog burst.
    Simulate(Box<SimulateArgs>),
    /// A running gateway's live status from its HTTP endpoint: groups, devices that
    /// need a look (offline, idle, distrusted clocks), links, outbox, recent alerts.
    Status(StatusArgs),
    /// Gateways on an upstream broker: list them, sign and push or roll out config (docs/reference.md#remote-configuration-fleet).
    Fleet(FleetArgs),
    /// Read-only dump of persisted state (run while the gateway is stopped).
    Inspect(InspectArgs),
    /// The standby pair's shared key (docs/reference.md#standby--two-boards-one-gateway).
    Pair(PairArgs),
}

/// `tidemark pair ...`
#[derive(Debug, clap::Args)]
pub struct PairArgs {
    #[command(subcommand)]
    pub command: PairCommand,
}

/// What `tidemark pair` does.
#[derive(Debug, clap::Subcommand)]
pub enum PairCommand {
    /// A fresh pair key (32 random bytes, base64) to FILE, mode 0600; never overwrites.
    Keygen(PairKeygenArgs),
}

/// `pair keygen`'s arguments.
#[derive(Debug, clap::Args)]
pub struct PairKeygenArgs {
    /// Where the key goes (it must not exist); copy the same file to both boards.
    #[arg(long)]
    pub out: PathBuf,
}

/// Run the gateway until SIGTERM/SIGINT, then flush state and exit 0.
#[derive(clap::Args)]
pub struct RunArgs {
    /// Configuration file (TOML); repeat to layer a site file over a base (later wins).
    #[arg(long, required = true)]
    pub config: Vec<PathBuf>,
}

/// Validate a config and print the effective configuration (secrets masked).
#[derive(clap::Args)]
pub struct CheckArgs {
    /// Configuration file (TOML); repeat to layer a site file over a base (later wins).
    #[arg(long, required = true)]
    pub config: Vec<PathBuf>,
}

/// Run the engine on a recorded capture (JSON lines) with a virtual clock.
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Configuration file (TOML); repeat to layer a site file over a base (later wins).
    #[arg(long, required = true)]
    pub config: Vec<PathBuf>,
    /// Capture: one `{"arrival": ms, "topic": ..., "payload": {...}}` per line.
    #[arg(long)]
    pub input: PathBuf,
    /// Output JSON lines (default: standard output).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Keep the virtual clock ticking this long past the last record.
    #[arg(long, default_value_t = 0)]
    pub drain_ms: u64,
    /// Use the durable store in this directory (resumable after a crash; needs --output).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// At the end of the input, emit every open window (a final watermark at +infinity).
    #[arg(long)]
    pub flush: bool,
    /// Give each output line `"at"`: the virtual time it came out (the arrival of
    /// the record it came with), to measure latency offline. Not with --state-dir.
    #[arg(long, conflicts_with = "state_dir")]
    pub timed: bool,
}

/// Record live traffic as a replay input (JSON lines), until Ctrl-C.
#[derive(clap::Args)]
pub struct CaptureArgs {
    /// Broker, `mqtt://host[:port]` or `mqtts://host[:port]`.
    #[arg(long)]
    pub url: String,
    /// Topic filter to record (repeatable).
    #[arg(long = "topic", required = true)]
    pub topics: Vec<String>,
    /// Output file, appended to (default: standard output).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Stop after this many messages.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration_s: Option<u64>,
}

/// Embedded broker + simulated fleet + gateway, with a live view; Ctrl-C stops it.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// Stop by itself after this many seconds.
    #[arg(long, alias = "duration-s")]
    pub duration: Option<f64>,
    /// Scrolling lines even on a terminal.
    #[arg(long)]
    pub plain: bool,
}

/// A running gateway's live status from its HTTP endpoint: groups, devices that
/// need a look (offline, idle, distrusted clocks), links, outbox, recent alerts.
#[derive(clap::Args)]
pub struct StatusArgs {
    /// The gateway's endpoint (default: `[metrics] listen` of --config, else
    /// http://127.0.0.1:9464).
    #[arg(long)]
    pub url: Option<String>,
    /// The gateway's config: its `metrics.listen` and `metrics.token_file` are used.
    #[arg(long)]
    pub config: Vec<PathBuf>,
    /// A file holding the endpoint's bearer token (`metrics.token_file`).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// One JSON document: status, devices, alerts as the API gives them.
    #[arg(long)]
    pub json: bool,
    /// Only devices of this group.
    #[arg(long)]
    pub group: Option<String>,
    /// Only devices in this state.
    #[arg(long, value_parser = ["active", "idle", "offline"])]
    pub state: Option<String>,
}

/// Gateways on an upstream broker: list them, sign and push or roll out config (docs/reference.md#remote-configuration-fleet).
#[derive(clap::Args)]
pub struct FleetArgs {
    #[command(subcommand)]
    pub command: FleetCommand,
}

/// Read-only dump of persisted state (run while the gateway is stopped).
#[derive(clap::Args)]
pub struct InspectArgs {
    /// State directory (holds tidemark.redb).
    #[arg(long)]
    pub state_dir: PathBuf,
    /// Machine-readable JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum FleetCommand {
    /// Every gateway on the broker from its retained status and latest metrics.
    Ls(LsArgs),
    /// A new Ed25519 signing key: FILE (mode 0600) and FILE.pub, PEM as OpenSSL writes them.
    Keygen(KeygenArgs),
    /// Signs CONFIG for one gateway, publishes it, waits for the result; exit 0 if applied.
    Push(PushArgs),
    /// Signs CONFIG for many gateways and pushes it in stages: canaries, then batches;
    /// stops (exit 1) when more than --max-failures reject it or roll it back.
    Rollout(RolloutArgs),
}

/// Every gateway on the broker from its retained status and latest metrics.
#[derive(clap::Args)]
pub struct LsArgs {
    /// The upstream broker, `mqtt://host[:port]` or `mqtts://host[:port]`.
    #[arg(long)]
    pub url: String,
    /// Topic filter of the gateways' output prefixes.
    #[arg(long, default_value = "tidemark/+")]
    pub prefix_filter: String,
    /// JSON for a machine.
    #[arg(long)]
    pub json: bool,
    /// Keep the table live until Ctrl-C.
    #[arg(long)]
    pub watch: bool,
    /// Longest wait for the metrics of the gateways that are online, seconds.
    #[arg(long, default_value_t = 12)]
    pub wait_s: u64,
}

/// A new Ed25519 signing key: FILE (mode 0600) and FILE.pub, PEM as OpenSSL writes them.
#[derive(clap::Args)]
pub struct KeygenArgs {
    /// Where the private key goes (it must not exist).
    #[arg(long)]
    pub out: PathBuf,
}

/// What `push` and `rollout` share: the broker, the signing key, the document.
#[derive(clap::Args)]
pub struct SignArgs {
    /// The upstream broker (the gateways' sink).
    #[arg(long)]
    pub url: String,
    /// The private key (PEM, PKCS#8).
    #[arg(long)]
    pub key: PathBuf,
    /// The document id: above the last one each gateway took.
    #[arg(long)]
    pub id: u64,
    /// The gateways' `sink.topic_prefix`.
    #[arg(long, default_value = "tidemark/{gateway}")]
    pub prefix: String,
    /// How long to wait for a result (push) or for one stage's results (rollout), seconds.
    #[arg(long, default_value_t = 120)]
    pub timeout_s: u64,
    /// Gateways refuse the document once this many seconds have passed (`not_after`).
    #[arg(long)]
    pub expires_in_s: Option<u64>,
    /// The TOML document (the remote layer).
    pub config: PathBuf,
}

/// Signs CONFIG for one gateway, publishes it, waits for the result; exit 0 if applied.
#[derive(clap::Args)]
pub struct PushArgs {
    /// The gateway's id.
    #[arg(long)]
    pub gateway: String,
    /// Sign the v1 form (no targets), for a gateway of an earlier release; a
    /// gateway of this one takes it only with `[fleet] accept_v1 = true`.
    #[arg(long)]
    pub v1: bool,
    #[command(flatten)]
    pub sign: SignArgs,
}

/// Signs CONFIG for many gateways and pushes it in stages (docs/reference.md#remote-configuration-fleet).
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["gateways", "match_", "all"])))]
pub struct RolloutArgs {
    /// These gateways, comma-separated (pushed in this order).
    #[arg(long, value_delimiter = ',')]
    pub gateways: Vec<String>,
    /// The gateways on the broker whose id matches this glob (`*`, `?`).
    #[arg(long = "match")]
    pub match_: Option<String>,
    /// Every gateway on the broker.
    #[arg(long)]
    pub all: bool,
    /// Gateways pushed to first, on their own.
    #[arg(long, default_value_t = 1)]
    pub canary: usize,
    /// Gateways per batch after the canaries.
    #[arg(long, default_value_t = 10)]
    pub batch: usize,
    /// Rejections and rollbacks tolerated; one more stops the rollout.
    #[arg(long, default_value_t = 0)]
    pub max_failures: usize,
    /// Also retain the document on P/config/desired once the rollout went
    /// through, so gateways away now take it when they come back.
    #[arg(long)]
    pub desired: bool,
    /// The report as JSON on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sign: SignArgs,
}

#[derive(clap::Args)]
pub struct SimulateArgs {
    /// Broker, `mqtt://host[:port]`.
    #[arg(long)]
    pub url: String,
    /// Messages per second in all; 0 = as fast as the broker takes them.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Stop after this many messages.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// QoS of every publish (0 or 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub qos: u8,
    /// Connections to publish over (devices are spread over them).
    #[arg(long, default_value_t = 1)]
    pub connections: u32,
    /// MQTT version.
    #[arg(long, value_enum, default_value = "v5")]
    pub protocol: Protocol,
    /// No progress lines.
    #[arg(long)]
    pub quiet: bool,
    /// The fleet and its misbehaviour.
    #[command(flatten)]
    pub fleet: tidemark::sim::SimConfig,
}
