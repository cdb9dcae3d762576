//! One body per command, each returning what became of it as a [`Failure`].

use std::time::Duration;

use tidemark::config;
use tidemark::replay;
use tidemark::tools::{capture, demo, fleet, simulate, status};

use super::args::*;
use super::logging::{init_logging, init_plain_logging};
use super::{Failure, load, load_gateway};
use tidemark::config::LogFormat;

/// Runs `command`.
pub fn dispatch(command: Command, log_format: Option<LogFormat>) -> Result<(), Failure> {
    match command {
        Command::Run(a) => run(&a, log_format),
        Command::Check(a) => check(&a),
        Command::Replay(a) => replay(&a, log_format),
        Command::Inspect(a) => super::inspect::run(&a.state_dir, a.json),
        Command::Status(a) => status(a),
        Command::Fleet(a) => fleet(a.command),
        Command::Pair(a) => match a.command {
            PairCommand::Keygen(k) => pair_keygen(&k.out),
        },
        Command::Demo(a) => {
            init_plain_logging(log_format);
            demo(&a)
        }
        Command::Simulate(a) => {
            init_plain_logging(log_format);
            simulate(*a)
        }
        Command::Capture(a) => {
            init_plain_logging(log_format);
            capture(&a)
        }
    }
}

fn run(a: &RunArgs, log_format: Option<LogFormat>) -> Result<(), Failure> {
    let (cfg, remote) = load_gateway(&a.config)?;
    let log = init_logging(&cfg, log_format);
    if let Some(r) = remote.as_ref().filter(|r| r.id > 0) {
        tracing::info!(
            document = r.id,
            "remote config layer from the state directory in force"
        );
    }
    let opts = tidemark::run::ReloadOptions {
        paths: a.config.clone(),
        log: Some(log),
        remote,
    };
    tidemark::run::run(&cfg, opts).map_err(|e| Failure::Failed(format!("tidemark stopped: {e}")))
}

/// Writes a new pair key to `out` (mode 0600, never over an existing file).
fn pair_keygen(out: &std::path::Path) -> Result<(), Failure> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let key = tidemark::pair::auth::Keys::generate().map_err(Failure::Failed)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .map_err(|e| Failure::Usage(format!("--out {}: {e}", out.display())))?;
    f.write_all(key.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| Failure::Failed(format!("{}: {e}", out.display())))?;
    println!(
        "pair key: {} (mode 0600); the same file on both boards, as [standby] key_file",
        out.display()
    );
    Ok(())
}

fn check(a: &CheckArgs) -> Result<(), Failure> {
    let cfg = load(&a.config)?;
    print!(
        "{}",
        config::annotate_sources(&cfg.effective_toml(), &cfg.sources)
    );
    Ok(())
}

fn replay(a: &ReplayArgs, log_format: Option<LogFormat>) -> Result<(), Failure> {
    let cfg = load(&a.config)?;
    let _ = init_logging(&cfg, log_format);
    let opts = replay::Options {
        input: &a.input,
        output: a.output.as_deref(),
        drain_ms: i64::try_from(a.drain_ms).unwrap_or(i64::MAX),
        state_dir: a.state_dir.as_deref(),
        flush: a.flush,
        timed: a.timed,
    };
    let (engine, s) =
        replay::run(&cfg, &opts).map_err(|e| Failure::Failed(format!("replay failed: {e}")))?;
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
    Ok(())
}

fn status(a: StatusArgs) -> Result<(), Failure> {
    let cfg = if a.config.is_empty() {
        None
    } else {
        Some(load(&a.config)?)
    };
    let url = a.url.unwrap_or_else(|| {
        cfg.as_ref()
            .and_then(|c| c.metrics.listen)
            .map_or_else(|| "http://127.0.0.1:9464".into(), |a| format!("http://{a}"))
    });
    let token = match a.token_file {
        Some(f) => Some(
            std::fs::read_to_string(&f)
                .map_err(|e| Failure::Usage(format!("--token-file {}: {e}", f.display())))?
                .trim()
                .to_owned(),
        ),
        None => cfg.and_then(|c| c.metrics.token),
    };
    let o = status::StatusOptions {
        url,
        token,
        json: a.json,
        group: a.group,
        state: a.state,
    };
    match status::run(&o) {
        Ok(text) => {
            print!("{text}");
            Ok(())
        }
        Err(e @ status::StatusError::Url(_)) => Err(Failure::Usage(e.to_string())),
        Err(e) => Err(Failure::Error(e.to_string())),
    }
}

fn fleet(command: FleetCommand) -> Result<(), Failure> {
    let done = match command {
        FleetCommand::Ls(a) => fleet::ls(&fleet::LsOptions {
            url: &a.url,
            prefix_filter: &a.prefix_filter,
            json: a.json,
            watch: a.watch,
            wait: Duration::from_secs(a.wait_s),
        })
        .map(|_| Ok(())),
        FleetCommand::Keygen(a) => fleet::keygen(&a.out).map(|public| {
            println!("private key: {} (mode 0600)", a.out.display());
            println!(
                "public key:  {} (list it in [fleet] trusted_keys)",
                public.display()
            );
            Ok(())
        }),
        FleetCommand::Push(a) => fleet::push(&fleet::PushOptions {
            url: &a.sign.url,
            key: &a.sign.key,
            gateway: &a.gateway,
            prefix: &a.sign.prefix,
            id: a.sign.id,
            config: &a.sign.config,
            timeout: Duration::from_secs(a.sign.timeout_s),
            not_after: not_after(a.sign.expires_in_s),
            v1: a.v1,
        })
        .map(|r| {
            println!("{}", serde_json::to_string(&r).unwrap_or_default());
            if fleet::applied(&r) {
                Ok(())
            } else {
                Err(Failure::NotDone)
            }
        }),
        FleetCommand::Rollout(a) => rollout(&a),
    };
    match done {
        Ok(result) => result,
        Err(fleet::FleetError::Usage(e)) => Err(Failure::Usage(e)),
        Err(fleet::FleetError::Failed(e)) => Err(Failure::Error(e)),
    }
}

fn not_after(expires_in_s: Option<u64>) -> Option<i64> {
    let now = tidemark::sys::clock::SystemClock::new().now().wall;
    expires_in_s
        .map(|s| now.saturating_add(i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX)))
}

fn rollout(a: &RolloutArgs) -> Result<Result<(), Failure>, fleet::FleetError> {
    use tidemark::tools::rollout::{self, Select};
    let select = match (&a.match_, a.all) {
        (Some(g), _) => Select::Match(g.clone()),
        (None, true) => Select::All,
        (None, false) => Select::Gateways(a.gateways.clone()),
    };
    let report = rollout::rollout(&rollout::RolloutOptions {
        url: &a.sign.url,
        key: &a.sign.key,
        id: a.sign.id,
        config: &a.sign.config,
        prefix: &a.sign.prefix,
        select,
        canary: a.canary,
        batch: a.batch,
        max_failures: a.max_failures,
        desired: a.desired,
        timeout: Duration::from_secs(a.sign.timeout_s),
        not_after: not_after(a.sign.expires_in_s),
    })?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        print!("{}", report.table());
    }
    Ok(if report.stopped {
        Err(Failure::NotDone)
    } else {
        Ok(())
    })
}

fn demo(a: &DemoArgs) -> Result<(), Failure> {
    let o = demo::DemoOptions {
        duration_s: a.duration,
        screen: !a.plain && std::io::IsTerminal::is_terminal(&std::io::stdout()),
    };
    demo::run(&o).map_err(|e| Failure::Failed(format!("demo failed: {e}")))
}

fn simulate(a: SimulateArgs) -> Result<(), Failure> {
    let o = simulate::SimulateOptions {
        url: a.url,
        rate: a.rate,
        count: a.count,
        duration_s: a.duration_s,
        qos: a.qos,
        connections: a.connections,
        v5: a.protocol == config::Protocol::V5,
        progress: !a.quiet,
    };
    match simulate::run(&o, a.fleet) {
        Ok(summary) => {
            println!("{}", serde_json::to_string(&summary).unwrap_or_default());
            Ok(())
        }
        Err(e @ simulate::SimulateError::Url(_)) => Err(Failure::Usage(e.to_string())),
        Err(e) => Err(Failure::Failed(format!("simulate failed: {e}"))),
    }
}

fn capture(a: &CaptureArgs) -> Result<(), Failure> {
    let o = capture::CaptureOptions {
        url: &a.url,
        topics: &a.topics,
        output: a.output.as_deref(),
        count: a.count,
        duration_s: a.duration_s,
    };
    match capture::run(&o) {
        Ok(_) => Ok(()),
        Err(e @ (capture::CaptureError::Url(_) | capture::CaptureError::Topic(_))) => {
            Err(Failure::Usage(e.to_string()))
        }
        Err(e) => Err(Failure::Failed(format!("capture failed: {e}"))),
    }
}
