//! The `tidemark` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tidemark::config::{self, Config, LogFormat};
use tidemark::replay;

mod inspect;

#[derive(Parser)]
#[command(
    name = "tidemark",
    version,
    about = "Event-time edge gateway for MQTT sensor fleets"
)]
struct Cli {
    /// Log line format (overrides `[log] format`).
    #[arg(long, global = true, value_enum)]
    log_format: Option<LogFormat>,
    /// Configuration file: `tidemark --config FILE` runs the gateway (repeatable, later wins).
    #[arg(long)]
    config: Vec<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum FleetCommand {
    /// Every gateway on the broker from its retained status and latest metrics.
    Ls {
        /// The upstream broker, `mqtt://host[:port]` or `mqtts://host[:port]`.
        #[arg(long)]
        url: String,
        /// Topic filter of the gateways' output prefixes.
        #[arg(long, default_value = "tidemark/+")]
        prefix_filter: String,
        /// JSON for a machine.
        #[arg(long)]
        json: bool,
        /// Keep the table live until Ctrl-C.
        #[arg(long)]
        watch: bool,
        /// Longest wait for the metrics of the gateways that are online, seconds.
        #[arg(long, default_value_t = 12)]
        wait_s: u64,
    },
    /// A new Ed25519 signing key: FILE (mode 0600) and FILE.pub, PEM as OpenSSL writes them.
    Keygen {
        /// Where the private key goes (it must not exist).
        #[arg(long)]
        out: PathBuf,
    },
    /// Signs CONFIG for one gateway, publishes it, waits for the result; exit 0 if applied.
    Push {
        /// The upstream broker (the gateway's sink).
        #[arg(long)]
        url: String,
        /// The private key (PEM, PKCS#8).
        #[arg(long)]
        key: PathBuf,
        /// The gateway's id.
        #[arg(long)]
        gateway: String,
        /// The document id: above the last one the gateway applied.
        #[arg(long)]
        id: u64,
        /// The gateway's `sink.topic_prefix`.
        #[arg(long, default_value = "tidemark/{gateway}")]
        prefix: String,
        /// How long to wait for the result.
        #[arg(long, default_value_t = 120)]
        timeout_s: u64,
        /// The TOML document (the remote layer).
        config: PathBuf,
    },
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway until SIGTERM/SIGINT, then flush state and exit 0.
    Run {
        /// Configuration file (TOML); repeat to layer a site file over a base (later wins).
        #[arg(long, required = true)]
        config: Vec<PathBuf>,
    },
    /// Validate a config and print the effective configuration (secrets masked).
    Check {
        /// Configuration file (TOML); repeat to layer a site file over a base (later wins).
        #[arg(long, required = true)]
        config: Vec<PathBuf>,
    },
    /// Run the engine on a recorded capture (JSON lines) with a virtual clock.
    Replay {
        /// Configuration file (TOML); repeat to layer a site file over a base (later wins).
        #[arg(long, required = true)]
        config: Vec<PathBuf>,
        /// Capture: one `{"arrival": ms, "topic": ..., "payload": {...}}` per line.
        #[arg(long)]
        input: PathBuf,
        /// Output JSON lines (default: standard output).
        #[arg(long)]
        output: Option<PathBuf>,
        /// Keep the virtual clock ticking this long past the last record.
        #[arg(long, default_value_t = 0)]
        drain_ms: u64,
        /// Use the durable store in this directory (resumable after a crash; needs --output).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// At the end of the input, emit every open window (a final watermark at +infinity).
        #[arg(long)]
        flush: bool,
    },
    /// Record live traffic as a replay input (JSON lines), until Ctrl-C.
    Capture {
        /// Broker, `mqtt://host[:port]` or `mqtts://host[:port]`.
        #[arg(long)]
        url: String,
        /// Topic filter to record (repeatable).
        #[arg(long = "topic", required = true)]
        topics: Vec<String>,
        /// Output file, appended to (default: standard output).
        #[arg(long)]
        output: Option<PathBuf>,
        /// Stop after this many messages.
        #[arg(long)]
        count: Option<u64>,
        /// Stop after this many seconds.
        #[arg(long)]
        duration_s: Option<u64>,
    },
    /// Embedded broker + simulated fleet + gateway, with a live view; Ctrl-C stops it.
    Demo {
        /// Stop by itself after this many seconds.
        #[arg(long, alias = "duration-s")]
        duration: Option<f64>,
        /// Scrolling lines even on a terminal.
        #[arg(long)]
        plain: bool,
    },
    /// Publish a synthetic fleet (seeded): skewed clocks, delays, disorder, late,
    /// duplicates, malformed messages, silent devices, an outage's backlog burst.
    Simulate(Box<SimulateArgs>),
    /// A running gateway's live status from its HTTP endpoint: groups, devices that
    /// need a look (offline, idle, distrusted clocks), links, outbox, recent alerts.
    Status {
        /// The gateway's endpoint (default: `[metrics] listen` of --config, else
        /// http://127.0.0.1:9464).
        #[arg(long)]
        url: Option<String>,
        /// The gateway's config: its `metrics.listen` and `metrics.token_file` are used.
        #[arg(long)]
        config: Vec<PathBuf>,
        /// A file holding the endpoint's bearer token (`metrics.token_file`).
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// One JSON document: status, devices, alerts as the API gives them.
        #[arg(long)]
        json: bool,
        /// Only devices of this group.
        #[arg(long)]
        group: Option<String>,
        /// Only devices in this state.
        #[arg(long, value_parser = ["active", "idle", "offline"])]
        state: Option<String>,
    },
    /// Gateways on an upstream broker: list them, sign and push config (SPEC §12).
    Fleet {
        #[command(subcommand)]
        command: FleetCommand,
    },
    /// Read-only dump of persisted state (run while the gateway is stopped).
    Inspect {
        /// State directory (holds tidemark.redb).
        #[arg(long)]
        state_dir: PathBuf,
        /// Machine-readable JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
struct SimulateArgs {
    /// Broker, `mqtt://host[:port]`.
    #[arg(long)]
    url: String,
    /// Seed of every random choice: the same seed makes the same fleet.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Devices in all.
    #[arg(long, default_value_t = 20)]
    devices: u32,
    /// Group names (comma-separated); devices are spread over them.
    #[arg(long, value_delimiter = ',', default_value = "hall,lab")]
    groups: Vec<String>,
    /// Topic prefix: `{prefix}/{group}/{device}/reading`.
    #[arg(long, default_value = "sensors")]
    prefix: String,
    /// Messages per second in all; 0 = as fast as the broker takes them.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// Stop after this many messages.
    #[arg(long)]
    count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    duration_s: Option<f64>,
    /// QoS of every publish (0 or 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    qos: u8,
    /// Connections to publish over (devices are spread over them).
    #[arg(long, default_value_t = 1)]
    connections: u32,
    /// MQTT version.
    #[arg(long, value_enum, default_value = "v5")]
    protocol: config::Protocol,
    /// Payload encoding.
    #[arg(long, value_enum, default_value = "json")]
    format: tidemark::sim::SimFormat,
    /// Device clock offsets are uniform in +-this (ms).
    #[arg(long, default_value_t = 0)]
    skew_ms: i64,
    /// The first device's clock is this far ahead (ms; e.g. 1020000 = 17 min).
    #[arg(long)]
    fast_clock_ms: Option<i64>,
    /// A fixed clock offset for one device, `INDEX:MS` (repeatable; e.g. `2:7200000`).
    #[arg(long = "clock-offset", value_parser = parse_clock_offset)]
    clock_offsets: Vec<(u32, i64)>,
    /// Network delay: readings are stamped up to this long before they are sent (ms).
    #[arg(long, default_value_t = 50)]
    delay_ms: i64,
    /// Fraction of readings stamped up to --disorder-ms earlier.
    #[arg(long, default_value_t = 0.0)]
    out_of_order: f64,
    /// How far out of order (ms).
    #[arg(long, default_value_t = 1000)]
    disorder_ms: i64,
    /// Fraction of readings stamped --late-by-ms in the past.
    #[arg(long, default_value_t = 0.0)]
    late: f64,
    /// How late (ms).
    #[arg(long, default_value_t = 600_000)]
    late_by_ms: i64,
    /// Fraction of readings sent twice (a QoS 1 redelivery).
    #[arg(long, default_value_t = 0.0)]
    duplicates: f64,
    /// Fraction of messages that are malformed (bad payload or topic).
    #[arg(long, default_value_t = 0.0)]
    malformed: f64,
    /// A heartbeat after every N readings of a device (0: none).
    #[arg(long, default_value_t = 0)]
    heartbeat_every: u32,
    /// The last this many devices fall silent at --silence-at-s for --silence-s.
    #[arg(long, default_value_t = 0)]
    silent: u32,
    /// Every device of this group stops for good at --silence-at-s.
    #[arg(long)]
    silent_group: Option<String>,
    /// When the silent devices stop (s since the start).
    #[arg(long, default_value_t = 10.0)]
    silence_at_s: f64,
    /// How long they stay silent (s).
    #[arg(long, default_value_t = 60.0)]
    silence_s: f64,
    /// The second device's clock steps by --step-ms at this time (s since the start).
    #[arg(long)]
    step_at_s: Option<f64>,
    /// Size of the clock step (ms).
    #[arg(long, default_value_t = 120_000)]
    step_ms: i64,
    /// The fleet's uplink goes down at this time (s since the start) for --outage-s;
    /// readings are kept and sent in one burst when it returns.
    #[arg(long)]
    outage_at_s: Option<f64>,
    /// Length of the outage (s).
    #[arg(long, default_value_t = 30.0)]
    outage_s: f64,
    /// Publish as Sparkplug B edge nodes (4 devices each, sharing a clock; births,
    /// metrics by alias with their own timestamps, a DDEATH when a device falls silent).
    #[arg(long)]
    sparkplug: bool,
    /// No progress lines.
    #[arg(long)]
    quiet: bool,
}

fn parse_clock_offset(s: &str) -> Result<(u32, i64), String> {
    let (i, ms) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: want INDEX:MS"))?;
    let i = i.parse().map_err(|e| format!("{s:?}: device index: {e}"))?;
    let ms = ms.parse().map_err(|e| format!("{s:?}: offset ms: {e}"))?;
    Ok((i, ms))
}

fn secs(s: f64) -> i64 {
    (s * 1000.0).round() as i64
}

fn simulate(a: &SimulateArgs) -> ExitCode {
    let fleet = tidemark::sim::SimConfig {
        seed: a.seed,
        devices: a.devices,
        groups: a.groups.clone(),
        prefix: a.prefix.clone(),
        format: a.format,
        skew_ms: a.skew_ms,
        fast_clock_ms: a.fast_clock_ms,
        clock_offsets: a.clock_offsets.clone(),
        delay_ms: a.delay_ms,
        out_of_order: a.out_of_order,
        disorder_ms: a.disorder_ms,
        late: a.late,
        late_by_ms: a.late_by_ms,
        duplicates: a.duplicates,
        malformed: a.malformed,
        heartbeat_every: a.heartbeat_every,
        silent: a.silent,
        silent_group: a.silent_group.clone(),
        silence_at_ms: secs(a.silence_at_s),
        silence_ms: secs(a.silence_s),
        step_at_ms: a.step_at_s.map(secs),
        step_ms: a.step_ms,
        outage_at_ms: a.outage_at_s.map(secs),
        outage_ms: secs(a.outage_s),
        sparkplug: a.sparkplug,
    };
    let o = tidemark::tools::simulate::SimulateOptions {
        url: a.url.clone(),
        rate: a.rate,
        count: a.count,
        duration_s: a.duration_s,
        qos: a.qos,
        connections: a.connections,
        v5: a.protocol == config::Protocol::V5,
        progress: !a.quiet,
    };
    match tidemark::tools::simulate::run(&o, fleet) {
        Ok(summary) => {
            println!("{}", serde_json::to_string(&summary).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(e @ tidemark::tools::simulate::SimulateError::Url(_)) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            tracing::error!("simulate failed: {e}");
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    tidemark::sys::memory::tune();
    let cli = Cli::parse();
    let command = match (cli.command, cli.config) {
        (Some(c), top) if top.is_empty() => c,
        (None, config) if !config.is_empty() => Command::Run { config },
        (Some(_), _) => {
            eprintln!(
                "error: --config goes after the subcommand (e.g. `tidemark run --config FILE`)"
            );
            return ExitCode::from(2);
        }
        (None, _) => {
            eprintln!("error: a subcommand or --config FILE is required (see `tidemark --help`)");
            return ExitCode::from(2);
        }
    };
    match command {
        Command::Run { config } => {
            let Some((cfg, remote)) = load_gateway(&config) else {
                return ExitCode::from(2);
            };
            let log = init_logging(&cfg, cli.log_format);
            if let Some(r) = remote.as_ref().filter(|r| r.id > 0) {
                tracing::info!(
                    document = r.id,
                    "remote config layer from the state directory in force"
                );
            }
            let opts = tidemark::run::ReloadOptions {
                paths: config.clone(),
                log: Some(log),
                remote,
            };
            match tidemark::run::run(&cfg, opts) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("tidemark stopped: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Check { config } => check(&config),
        Command::Replay {
            config,
            input,
            output,
            drain_ms,
            state_dir,
            flush,
        } => {
            let Some(cfg) = load(&config) else {
                return ExitCode::from(2);
            };
            let _ = init_logging(&cfg, cli.log_format);
            let opts = replay::Options {
                input: &input,
                output: output.as_deref(),
                drain_ms: i64::try_from(drain_ms).unwrap_or(i64::MAX),
                state_dir: state_dir.as_deref(),
                flush,
            };
            replay_cmd(&cfg, &opts)
        }
        Command::Inspect { state_dir, json } => inspect::run(&state_dir, json),
        Command::Status {
            url,
            config,
            token_file,
            json,
            group,
            state,
        } => status(url, &config, token_file, json, group, state),
        Command::Fleet { command } => fleet(command),
        Command::Demo { duration, plain } => {
            init_plain_logging(cli.log_format);
            let o = tidemark::tools::demo::DemoOptions {
                duration_s: duration,
                screen: !plain && std::io::IsTerminal::is_terminal(&std::io::stdout()),
            };
            match tidemark::tools::demo::run(&o) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("demo failed: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Simulate(args) => {
            init_plain_logging(cli.log_format);
            simulate(&args)
        }
        Command::Capture {
            url,
            topics,
            output,
            count,
            duration_s,
        } => {
            init_plain_logging(cli.log_format);
            let o = tidemark::tools::capture::CaptureOptions {
                url: &url,
                topics: &topics,
                output: output.as_deref(),
                count,
                duration_s,
            };
            match tidemark::tools::capture::run(&o) {
                Ok(_) => ExitCode::SUCCESS,
                Err(
                    e @ (tidemark::tools::capture::CaptureError::Url(_)
                    | tidemark::tools::capture::CaptureError::Topic(_)),
                ) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
                Err(e) => {
                    tracing::error!("capture failed: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

fn status(
    url: Option<String>,
    config: &[PathBuf],
    token_file: Option<PathBuf>,
    json: bool,
    group: Option<String>,
    state: Option<String>,
) -> ExitCode {
    let cfg = if config.is_empty() {
        None
    } else {
        let Some(cfg) = load(config) else {
            return ExitCode::from(2);
        };
        Some(cfg)
    };
    let url = url.unwrap_or_else(|| {
        cfg.as_ref()
            .and_then(|c| c.metrics.listen)
            .map_or_else(|| "http://127.0.0.1:9464".into(), |a| format!("http://{a}"))
    });
    let token = match token_file {
        Some(f) => match std::fs::read_to_string(&f) {
            Ok(t) => Some(t.trim().to_owned()),
            Err(e) => {
                eprintln!("error: --token-file {}: {e}", f.display());
                return ExitCode::from(2);
            }
        },
        None => cfg.and_then(|c| c.metrics.token),
    };
    let o = tidemark::tools::status::StatusOptions {
        url,
        token,
        json,
        group,
        state,
    };
    match tidemark::tools::status::run(&o) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e @ tidemark::tools::status::StatusError::Url(_)) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn fleet(command: FleetCommand) -> ExitCode {
    use tidemark::tools::fleet::{self, FleetError};
    let done = match command {
        FleetCommand::Ls {
            url,
            prefix_filter,
            json,
            watch,
            wait_s,
        } => fleet::ls(&fleet::LsOptions {
            url: &url,
            prefix_filter: &prefix_filter,
            json,
            watch,
            wait: std::time::Duration::from_secs(wait_s),
        })
        .map(|_| ExitCode::SUCCESS),
        FleetCommand::Keygen { out } => fleet::keygen(&out).map(|public| {
            println!("private key: {} (mode 0600)", out.display());
            println!(
                "public key:  {} (list it in [fleet] trusted_keys)",
                public.display()
            );
            ExitCode::SUCCESS
        }),
        FleetCommand::Push {
            url,
            key,
            gateway,
            id,
            prefix,
            timeout_s,
            config,
        } => fleet::push(&fleet::PushOptions {
            url: &url,
            key: &key,
            gateway: &gateway,
            prefix: &prefix,
            id,
            config: &config,
            timeout: std::time::Duration::from_secs(timeout_s),
        })
        .map(|r| {
            println!("{}", serde_json::to_string(&r).unwrap_or_default());
            if fleet::applied(&r) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }),
    };
    match done {
        Ok(code) => code,
        Err(FleetError::Usage(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(FleetError::Failed(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn load(paths: &[PathBuf]) -> Option<Config> {
    load_gateway(paths).map(|(cfg, _)| cfg)
}

/// The config with the remote layer kept in `state_dir` (SPEC §12).
fn load_gateway(paths: &[PathBuf]) -> Option<(Config, Option<tidemark::fleet::Remote>)> {
    match config::load_gateway(paths) {
        Ok((cfg, remote, warning)) => {
            if let Some(w) = warning {
                eprintln!("warning: {w}");
            }
            Some((cfg, remote))
        }
        Err(e) => {
            for p in &e.problems {
                eprintln!("error: {p}");
            }
            None
        }
    }
}

/// Logging for `run` and `replay`; returns the setter a reload uses for `[log] level`.
fn init_logging(cfg: &Config, format: Option<LogFormat>) -> tidemark::run::LogControl {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // The embedded broker's own logs (every client connect and disconnect) stay off
    // unless RUST_LOG asks for them.
    let from_env = tracing_subscriber::EnvFilter::try_from_default_env().ok();
    let env_wins = from_env.is_some();
    let level = |l: &str| tracing_subscriber::EnvFilter::try_new(format!("{l},rumqttd=off"));
    let filter = from_env.unwrap_or_else(|| {
        level(&cfg.log.level).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
    });
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let registry = tracing_subscriber::registry().with(filter);
    match format.unwrap_or(cfg.log.format) {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(ansi)
                    .with_writer(std::io::stderr),
            )
            .init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr),
            )
            .init(),
    }
    Box::new(move |l: &str| {
        if env_wins {
            tracing::info!("RUST_LOG is set and wins over log.level");
            return Ok(());
        }
        let f = level(l).map_err(|e| e.to_string())?;
        handle.reload(f).map_err(|e| e.to_string())
    })
}

/// Logging for commands without a config file.
fn init_plain_logging(format: Option<LogFormat>) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format.unwrap_or(LogFormat::Text) {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn check(paths: &[PathBuf]) -> ExitCode {
    match load(paths) {
        Some(cfg) => {
            print!(
                "{}",
                config::annotate_sources(&cfg.effective_toml(), &cfg.sources)
            );
            ExitCode::SUCCESS
        }
        None => ExitCode::from(2),
    }
}

fn replay_cmd(cfg: &Config, opts: &replay::Options<'_>) -> ExitCode {
    match replay::run(cfg, opts) {
        Ok((engine, s)) => {
            let c = engine.counters();
            tracing::info!(
                records = s.records,
                outputs = s.outputs,
                commits = s.commits,
                accepted = c.accepted,
                late = c.late,
                duplicates = c.duplicates,
                windows = c.windows_emitted,
                "replay finished"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!("replay failed: {e}");
            ExitCode::from(1)
        }
    }
}
