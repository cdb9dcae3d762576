//! `tidemark fleet rollout` (docs/reference.md#remote-configuration-fleet): one document, signed for the chosen
//! gateways, pushed to a few canaries, then in batches; stopped when more than
//! `--max-failures` are rejected or rolled back; with `--desired` retained as
//! the desired state once it went through, so gateways away now converge later.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::fleet::{FleetError, connect, decode, key_and_text, runtime};
use crate::fleet::{ConfigResult, Document, Outcome};
use crate::sys::clock::SystemClock;
use crate::sys::link::{Client, Event, Loop};

/// Which gateways a rollout is for.
pub enum Select {
    /// These ids, whether they are seen or not.
    Gateways(Vec<String>),
    /// The ids seen on the broker that match this glob (`*`, `?`).
    Match(String),
    /// Every id seen on the broker.
    All,
}

/// `fleet rollout`'s arguments.
pub struct RolloutOptions<'a> {
    /// The upstream broker.
    pub url: &'a str,
    /// The signing key (PEM, PKCS#8).
    pub key: &'a Path,
    /// The document id: above the last one each gateway took.
    pub id: u64,
    /// The TOML document.
    pub config: &'a Path,
    /// The gateways' output prefix with `{gateway}`.
    pub prefix: &'a str,
    /// Which gateways.
    pub select: Select,
    /// Gateways pushed to first, on their own.
    pub canary: usize,
    /// Gateways per batch after the canaries.
    pub batch: usize,
    /// Rejected or rolled back gateways tolerated; one more stops the rollout.
    pub max_failures: usize,
    /// Retain the document as the desired state once the rollout went through.
    pub desired: bool,
    /// Longest wait for one stage's results.
    pub timeout: Duration,
    /// Epoch ms after which gateways refuse it.
    pub not_after: Option<i64>,
}

/// What became of the rollout on one gateway.
#[derive(Debug, Clone, Serialize)]
pub struct GatewayResult {
    /// Gateway id.
    pub gateway: String,
    /// `applied`, `rejected`, `rolled_back`, `offline` (pending: it takes the
    /// desired document when it is back), `no_result` (pending: online, but no
    /// answer in time) or `not_pushed` (the rollout stopped before it).
    pub result: String,
    /// The gateway's reasons (rejected, rolled back).
    pub errors: Vec<String>,
    /// `canary` or `batch N`.
    pub stage: String,
}

/// The rollout's report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The document id.
    pub id: u64,
    /// Stopped by failures (exit 1).
    pub stopped: bool,
    /// Retained as the desired state.
    pub desired: bool,
    /// From the first push to the last result, ms.
    pub took_ms: i64,
    /// One per gateway, in rollout order.
    pub gateways: Vec<GatewayResult>,
}

impl Report {
    /// The count of gateways with `result`.
    pub fn count(&self, result: &str) -> usize {
        self.gateways.iter().filter(|g| g.result == result).count()
    }

    /// The final table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let w = self
            .gateways
            .iter()
            .map(|g| g.gateway.len())
            .max()
            .unwrap_or(0)
            .max(7);
        out.push_str(&format!(
            "{:<w$}  {:<8}  {:<11}  ERRORS\n",
            "GATEWAY", "STAGE", "RESULT"
        ));
        for g in &self.gateways {
            let line = format!(
                "{:<w$}  {:<8}  {:<11}  {}",
                g.gateway,
                g.stage,
                g.result,
                g.errors.join("; ")
            );
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out.push_str(&format!(
            "document {}: {} applied, {} rejected, {} rolled back, {} offline (pending), {} no result, {} not pushed; {} ms from first push to last result{}{}\n",
            self.id,
            self.count("applied"),
            self.count("rejected"),
            self.count("rolled_back"),
            self.count("offline"),
            self.count("no_result"),
            self.count("not_pushed"),
            self.took_ms,
            if self.desired { "; retained as the desired state" } else { "" },
            if self.stopped { "; STOPPED" } else { "" },
        ));
        out
    }
}

/// `*` any run, `?` one character.
pub fn glob(pattern: &str, s: &str) -> bool {
    fn go(p: &[char], s: &[char]) -> bool {
        match p.split_first() {
            None => s.is_empty(),
            Some(('*', rest)) => (0..=s.len()).any(|i| go(rest, &s[i..])),
            Some((c, rest)) => s
                .split_first()
                .is_some_and(|(h, t)| (*c == '?' || c == h) && go(rest, t)),
        }
    }
    let (p, s): (Vec<char>, Vec<char>) = (pattern.chars().collect(), s.chars().collect());
    go(&p, &s)
}

/// The prefix template's levels and where the gateway id is among them.
struct Prefix {
    levels: Vec<String>,
    at: usize,
}

impl Prefix {
    fn parse(template: &str) -> Result<Self, FleetError> {
        let levels: Vec<String> = template.split('/').map(str::to_owned).collect();
        let at = levels
            .iter()
            .position(|l| l == "{gateway}")
            .ok_or_else(|| {
                FleetError::Usage(format!(
                    "--prefix {template:?}: needs a level that is exactly {{gateway}}"
                ))
            })?;
        Ok(Self { levels, at })
    }

    fn of(&self, gateway: &str) -> String {
        let mut l = self.levels.clone();
        gateway.clone_into(&mut l[self.at]);
        l.join("/")
    }

    /// The gateway and the leaf of a topic under some gateway's prefix.
    fn split<'t>(&self, topic: &'t str) -> Option<(&'t str, &'t str)> {
        let parts: Vec<&str> = topic.splitn(self.levels.len() + 1, '/').collect();
        let leaf = *parts.get(self.levels.len())?;
        let ok = self
            .levels
            .iter()
            .enumerate()
            .all(|(i, l)| i == self.at || parts.get(i) == Some(&l.as_str()));
        ok.then(|| (parts[self.at], leaf))
    }
}

/// What the rollout has heard: statuses, and results for its document.
#[derive(Default)]
struct Heard {
    subscribed: bool,
    /// `online` / `offline` per gateway (retained, then live).
    state: BTreeMap<String, String>,
    results: BTreeMap<String, ConfigResult>,
    acks: usize,
}

struct Link {
    client: Client,
    lp: Loop,
    prefix: Prefix,
    id: u64,
    heard: Heard,
    url: String,
    filters: Vec<String>,
}

impl Link {
    /// Takes events until `done` holds or `limit` has passed; false on the limit.
    async fn until(
        &mut self,
        limit: Duration,
        done: impl Fn(&Heard) -> bool,
    ) -> Result<bool, FleetError> {
        let over = tokio::time::sleep(limit);
        tokio::pin!(over);
        while !done(&self.heard) {
            tokio::select! {
                () = &mut over => return Ok(false),
                ev = self.lp.poll() => match ev {
                    Err(e) => return Err(FleetError::Failed(format!("{}: {e}", self.url))),
                    Ok(ev) => self.take(ev),
                },
            }
        }
        Ok(true)
    }

    fn take(&mut self, ev: Event) {
        match ev {
            Event::Connected { .. } => {
                let _ = self.client.subscribe(&self.filters, 1);
            }
            Event::Subscribed { .. } => self.heard.subscribed = true,
            Event::Message {
                topic,
                payload,
                retained,
                ..
            } => {
                let Some((gw, leaf)) = self.prefix.split(&topic) else {
                    return;
                };
                let Some(v) = decode(&payload) else { return };
                match leaf {
                    "status" => {
                        if let Some(s) = v["state"].as_str() {
                            self.heard.state.insert(gw.to_owned(), s.to_owned());
                        }
                    }
                    // A retained result was answered before this run.
                    "config/result" if !retained => {
                        if let Ok(r) = serde_json::from_value::<ConfigResult>(v)
                            && r.id == Some(self.id)
                        {
                            self.heard.results.insert(gw.to_owned(), r);
                        }
                    }
                    _ => {}
                }
            }
            Event::PubAck { .. } => self.heard.acks += 1,
            _ => {}
        }
    }

    /// Publishes, taking events while the request queue is full.
    async fn publish(
        &mut self,
        topic: &str,
        payload: &[u8],
        retain: bool,
    ) -> Result<(), FleetError> {
        for _ in 0..1000 {
            if self
                .client
                .publish(topic, payload.to_vec(), 1, retain)
                .is_ok()
            {
                return Ok(());
            }
            match tokio::time::timeout(Duration::from_millis(100), self.lp.poll()).await {
                Ok(Ok(ev)) => self.take(ev),
                Ok(Err(e)) => return Err(FleetError::Failed(format!("{}: {e}", self.url))),
                Err(_) => {}
            }
        }
        Err(FleetError::Failed(format!(
            "{}: cannot publish to {topic}",
            self.url
        )))
    }
}

/// Runs the rollout; `Ok(report)` whatever became of it (exit 1 when stopped).
pub fn rollout(o: &RolloutOptions<'_>) -> Result<Report, FleetError> {
    let (key, text) = key_and_text(o.key, o.config)?;
    let prefix = Prefix::parse(o.prefix)?;
    if let Select::Match(g) = &o.select
        && g.is_empty()
    {
        return Err(FleetError::Usage("--match: an empty pattern".into()));
    }
    if o.batch == 0 {
        return Err(FleetError::Usage("--batch: must be at least 1".into()));
    }
    let (client, lp) = connect(o.url, "rollout")?;
    let filters = vec![
        format!("{}/status", prefix.of("+")),
        format!("{}/config/result", prefix.of("+")),
    ];
    let mut link = Link {
        client,
        lp,
        prefix,
        id: o.id,
        heard: Heard::default(),
        url: o.url.to_owned(),
        filters,
    };
    runtime()?.block_on(async {
        if !link
            .until(Duration::from_secs(10), |h| h.subscribed)
            .await?
        {
            return Err(FleetError::Failed(format!(
                "{}: no SUBACK within 10 s",
                o.url
            )));
        }
        // The retained statuses come right after the SUBACK.
        link.until(Duration::from_millis(700), |_| false).await?;
        let targets = chosen(&o.select, &link.heard);
        if targets.is_empty() {
            return Err(FleetError::Failed(format!(
                "no gateway on {} matches (none has a retained status under {})",
                o.url,
                link.prefix.of("+")
            )));
        }
        if let Some(bad) = targets.iter().find(|t| !crate::fleet::valid_target(t)) {
            return Err(FleetError::Usage(format!(
                "gateway {bad:?}: a gateway id is [A-Za-z0-9_-]{{1,64}}"
            )));
        }
        let doc = Document::signed(o.id, text, (targets.clone(), o.not_after), &key);
        let doc = serde_json::to_vec(&doc).map_err(|e| FleetError::Failed(e.to_string()))?;
        let report = stages(o, &mut link, &targets, &doc).await?;
        let _ = link.client.disconnect();
        Ok(report)
    })
}

fn chosen(select: &Select, heard: &Heard) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    match select {
        Select::Gateways(list) => {
            for g in list {
                if !out.contains(g) {
                    out.push(g.clone());
                }
            }
        }
        Select::Match(p) => out.extend(heard.state.keys().filter(|g| glob(p, g)).cloned()),
        Select::All => out.extend(heard.state.keys().cloned()),
    }
    out
}

/// What became of the document pushed to `g`, and whether `g` answered.
fn outcome(heard: &Heard, g: &str, stage: &str) -> (GatewayResult, bool) {
    match heard.results.get(g) {
        Some(r) => {
            let result = match r.result {
                Outcome::Applied => "applied",
                Outcome::Rejected => "rejected",
                Outcome::RolledBack => "rolled_back",
            };
            (entry(g, result, r.errors.clone(), stage), true)
        }
        None if heard.state.get(g).map(String::as_str) != Some("online") => {
            (entry(g, "offline", Vec::new(), stage), false)
        }
        None => (entry(g, "no_result", Vec::new(), stage), false),
    }
}

async fn stages(
    o: &RolloutOptions<'_>,
    link: &mut Link,
    targets: &[String],
    doc: &[u8],
) -> Result<Report, FleetError> {
    let clock = SystemClock::new();
    let mut plan: Vec<(String, &[String])> = Vec::new();
    let canary = o.canary.min(targets.len());
    if canary > 0 {
        plan.push(("canary".into(), &targets[..canary]));
    }
    for (i, b) in targets[canary..].chunks(o.batch).enumerate() {
        plan.push((format!("batch {}", i + 1), b));
    }
    let mut report = Report {
        id: o.id,
        stopped: false,
        desired: false,
        took_ms: 0,
        gateways: Vec::new(),
    };
    let (mut first_push, mut last_result) = (None, None);
    let mut failures = 0usize;
    let mut published = 0usize;
    for (stage, gws) in &plan {
        if report.stopped {
            for g in *gws {
                report
                    .gateways
                    .push(entry(g, "not_pushed", Vec::new(), stage));
            }
            continue;
        }
        let mut pushed = Vec::new();
        for g in *gws {
            if link.heard.state.get(g).map(String::as_str) == Some("online") {
                let topic = format!("{}/config/set", link.prefix.of(g));
                link.publish(&topic, doc, false).await?;
                published += 1;
                first_push.get_or_insert_with(|| clock.mono());
                pushed.push(g.clone());
            } else {
                report.gateways.push(entry(g, "offline", Vec::new(), stage));
            }
        }
        let answered = |h: &Heard| {
            pushed.iter().all(|g| {
                h.results.contains_key(g) || h.state.get(g).map(String::as_str) != Some("online")
            })
        };
        link.until(o.timeout, answered).await?;
        for g in &pushed {
            let (e, answered) = outcome(&link.heard, g, stage);
            if answered {
                last_result = Some(clock.mono());
            }
            report.gateways.push(e);
        }
        let here = &report.gateways[report.gateways.len() - gws.len()..];
        let n = |r: &str| here.iter().filter(|g| g.result == r).count();
        failures += n("rejected") + n("rolled_back");
        eprintln!(
            "{stage}: {} gateways: {} applied, {} rejected, {} rolled back, {} offline, {} no result",
            gws.len(),
            n("applied"),
            n("rejected"),
            n("rolled_back"),
            n("offline"),
            n("no_result")
        );
        if failures > o.max_failures {
            eprintln!(
                "stopping the rollout: {failures} gateways rejected or rolled back the document (--max-failures {})",
                o.max_failures
            );
            report.stopped = true;
        }
    }
    report.took_ms = first_push
        .zip(last_result)
        .map_or(0, |(f, l): (i64, i64)| l - f);
    if o.desired && !report.stopped {
        for g in targets {
            let topic = format!("{}/config/desired", link.prefix.of(g));
            link.publish(&topic, doc, true).await?;
            published += 1;
        }
        if !link
            .until(Duration::from_secs(30), |h| h.acks >= published)
            .await?
        {
            return Err(FleetError::Failed(format!(
                "{}: the broker did not acknowledge the desired documents",
                o.url
            )));
        }
        report.desired = true;
    }
    Ok(report)
}

fn entry(gateway: &str, result: &str, errors: Vec<String>, stage: &str) -> GatewayResult {
    GatewayResult {
        gateway: gateway.to_owned(),
        result: result.to_owned(),
        errors,
        stage: stage.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_gateway_ids() {
        for (p, s, m) in [
            ("*", "gw-1", true),
            ("gw-*", "gw-17", true),
            ("gw-?", "gw-17", false),
            ("gw-??", "gw-17", true),
            ("*-north-*", "site-north-3", true),
            ("*-north-*", "site-south-3", false),
            ("gw", "gw-1", false),
            ("", "", true),
        ] {
            assert_eq!(glob(p, s), m, "{p} {s}");
        }
    }

    #[test]
    fn topics_split_at_the_gateway_level() {
        let p = Prefix::parse("site/{gateway}/out").unwrap();
        assert_eq!(p.of("gw1"), "site/gw1/out");
        assert_eq!(p.split("site/gw1/out/status"), Some(("gw1", "status")));
        assert_eq!(
            p.split("site/gw1/out/config/result"),
            Some(("gw1", "config/result"))
        );
        assert_eq!(p.split("site/gw1/in/status"), None);
        assert_eq!(p.split("site/gw1/out"), None);
        assert!(Prefix::parse("tidemark/gw").is_err());
    }
}
