//! Topic pattern parsing and matching (docs/reference.md#input), pure.

use crate::model::{Id, Kind, valid_id};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Group,
    Device,
    Kind,
}

/// A parsed `topic_pattern` such as `sensors/{group}/{device}/{kind}`; as a
/// serde value, the pattern as written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TopicPattern {
    segments: Vec<Segment>,
}

/// The parts of a matched topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicParts {
    /// Group id.
    pub group: Id,
    /// Device id.
    pub device: Id,
    /// Reading or heartbeat.
    pub kind: Kind,
}

/// Why a topic did not match (detail of a `bad_topic` rejection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicError {
    /// Different number of levels.
    Levels,
    /// A literal level differs.
    Literal,
    /// Group id outside the allowed alphabet or length.
    BadGroup,
    /// Device id outside the allowed alphabet or length.
    BadDevice,
    /// Kind is neither `reading` nor `heartbeat`.
    BadKind,
}

impl std::fmt::Display for TopicError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TopicError::Levels => "topic does not match topic_pattern (number of levels)",
            TopicError::Literal => "topic does not match topic_pattern",
            TopicError::BadGroup => "group must be 1..64 chars of [A-Za-z0-9_.:-]",
            TopicError::BadDevice => "device must be 1..64 chars of [A-Za-z0-9_.:-]",
            TopicError::BadKind => "kind must be reading or heartbeat",
        })
    }
}

impl TryFrom<String> for TopicPattern {
    type Error = String;
    fn try_from(p: String) -> Result<Self, String> {
        Self::parse(&p)
    }
}

impl From<TopicPattern> for String {
    fn from(p: TopicPattern) -> String {
        let levels: Vec<&str> = p
            .segments
            .iter()
            .map(|s| match s {
                Segment::Literal(l) => l.as_str(),
                Segment::Group => "{group}",
                Segment::Device => "{device}",
                Segment::Kind => "{kind}",
            })
            .collect();
        levels.join("/")
    }
}

impl TopicPattern {
    /// Parses a pattern; `{group}`, `{device}` and `{kind}` must each fill one whole level, once.
    pub fn parse(p: &str) -> Result<Self, String> {
        let mut segments = Vec::new();
        for level in p.split('/') {
            let seg = match level {
                "{group}" => Segment::Group,
                "{device}" => Segment::Device,
                "{kind}" => Segment::Kind,
                l if l.contains(['{', '}']) => {
                    return Err(format!(
                        "level {l:?}: placeholders must be a whole level and one of {{group}} {{device}} {{kind}}"
                    ));
                }
                l if l.contains(['+', '#', '\0']) => {
                    return Err(format!("level {l:?} must not contain + # or NUL"));
                }
                l => Segment::Literal(l.to_string()),
            };
            segments.push(seg);
        }
        for (ph, name) in [
            (Segment::Group, "{group}"),
            (Segment::Device, "{device}"),
            (Segment::Kind, "{kind}"),
        ] {
            let n = segments.iter().filter(|s| **s == ph).count();
            if n != 1 {
                return Err(format!("must contain {name} exactly once"));
            }
        }
        Ok(Self { segments })
    }

    /// Matches a concrete topic.
    pub fn parse_topic(&self, topic: &str) -> Result<TopicParts, TopicError> {
        let mut group = None;
        let mut device = None;
        let mut kind = None;
        // Levels cut by hand: `str::split`'s searcher cost more than the rest of the match.
        let mut rest = Some(topic);
        for seg in &self.segments {
            let level = next_level(&mut rest).ok_or(TopicError::Levels)?;
            match seg {
                Segment::Literal(l) => {
                    if l != level {
                        return Err(TopicError::Literal);
                    }
                }
                Segment::Group => group = Some(level),
                Segment::Device => device = Some(level),
                Segment::Kind => kind = Some(level),
            }
        }
        if rest.is_some() {
            return Err(TopicError::Levels);
        }
        parts(group, device, kind)
    }
}

/// The matched levels checked as ids and a kind.
fn parts(
    group: Option<&str>,
    device: Option<&str>,
    kind: Option<&str>,
) -> Result<TopicParts, TopicError> {
    let group = group.filter(|g| valid_id(g)).ok_or(TopicError::BadGroup)?;
    let device = device
        .filter(|d| valid_id(d))
        .ok_or(TopicError::BadDevice)?;
    let kind = match kind {
        Some("reading") => Kind::Reading,
        Some("heartbeat") => Kind::Heartbeat,
        _ => return Err(TopicError::BadKind),
    };
    Ok(TopicParts {
        group: Id::try_from(group).map_err(|_| TopicError::BadGroup)?,
        device: Id::try_from(device).map_err(|_| TopicError::BadDevice)?,
        kind,
    })
}

impl TopicPattern {
    /// The group and device levels of a topic the pattern matches by its level
    /// count alone: a cheap guess of [`TopicPattern::parse_topic`]'s ids (replay's
    /// look-ahead), not a check.
    pub fn ids<'t>(&self, topic: &'t str) -> Option<(&'t str, &'t str)> {
        let (mut group, mut device) = (None, None);
        let mut rest = Some(topic);
        for seg in &self.segments {
            let level = next_level(&mut rest)?;
            match seg {
                Segment::Group => group = Some(level),
                Segment::Device => device = Some(level),
                _ => {}
            }
        }
        group.zip(device)
    }
}

/// The level at the front of `rest`, as `split('/')` gives them; None past the last.
#[inline(always)]
fn next_level<'t>(rest: &mut Option<&'t str>) -> Option<&'t str> {
    let r = (*rest)?;
    match crate::scan::find(r.as_bytes(), b'/') {
        Some(i) => {
            *rest = Some(&r[i + 1..]);
            Some(&r[..i])
        }
        None => {
            *rest = None;
            Some(r)
        }
    }
}

/// Checks an MQTT subscription filter.
pub fn validate_filter(f: &str) -> Result<(), String> {
    if f.is_empty() {
        return Err("empty filter".into());
    }
    if f.len() > 65_535 || f.contains('\0') {
        return Err("too long or contains NUL".into());
    }
    let levels: Vec<&str> = f.split('/').collect();
    for (i, l) in levels.iter().enumerate() {
        if l.contains('#') && (*l != "#" || i + 1 != levels.len()) {
            return Err("# must be the whole last level".into());
        }
        if l.contains('+') && *l != "+" {
            return Err("+ must be a whole level".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build_default() -> TopicPattern {
        TopicPattern::parse("sensors/{group}/{device}/{kind}").unwrap()
    }

    #[test]
    fn default_pattern_extracts_group_device_and_kind() {
        let p = build_default()
            .parse_topic("sensors/hvac/dev-1/reading")
            .unwrap();
        assert_eq!(
            (p.group.as_str(), p.device.as_str(), p.kind),
            ("hvac", "dev-1", Kind::Reading)
        );
        let h = build_default()
            .parse_topic("sensors/a/b/heartbeat")
            .unwrap();
        assert_eq!(h.kind, Kind::Heartbeat);
    }

    #[test]
    fn mismatching_topics_are_errors_with_a_cause() {
        let p = build_default();
        assert_eq!(p.parse_topic("sensors/a/b"), Err(TopicError::Levels));
        assert_eq!(
            p.parse_topic("sensors/a/b/reading/x"),
            Err(TopicError::Levels)
        );
        assert_eq!(p.parse_topic("other/a/b/reading"), Err(TopicError::Literal));
        assert_eq!(
            p.parse_topic("sensors/a/b/status"),
            Err(TopicError::BadKind)
        );
        assert_eq!(
            p.parse_topic("sensors//b/reading"),
            Err(TopicError::BadGroup)
        );
        assert_eq!(
            p.parse_topic("sensors/a/$b/reading"),
            Err(TopicError::BadDevice)
        );
        let long = "d".repeat(65);
        assert_eq!(
            p.parse_topic(&format!("sensors/a/{long}/reading")),
            Err(TopicError::BadDevice)
        );
    }

    #[test]
    fn patterns_may_reorder_placeholders() {
        let p = TopicPattern::parse("site/{kind}/{device}/x/{group}").unwrap();
        let t = p.parse_topic("site/heartbeat/d1/x/g1").unwrap();
        assert_eq!((t.group.as_str(), t.device.as_str()), ("g1", "d1"));
    }

    #[test]
    fn bad_patterns_are_refused() {
        assert!(TopicPattern::parse("sensors/{group}/{device}").is_err());
        assert!(TopicPattern::parse("sensors/{group}/{group}/{device}/{kind}").is_err());
        assert!(TopicPattern::parse("s/{group}x/{device}/{kind}").is_err());
        assert!(TopicPattern::parse("s/+/{group}/{device}/{kind}").is_err());
    }

    #[test]
    fn filters_follow_mqtt_wildcard_rules() {
        assert!(validate_filter("sensors/+/+/+").is_ok());
        assert!(validate_filter("sensors/#").is_ok());
        assert!(validate_filter("sensors/#/x").is_err());
        assert!(validate_filter("sensors/a+").is_err());
        assert!(validate_filter("").is_err());
    }

    /// The matcher as it was, on `str::split`: the reference for the hand-cut levels.
    fn split_reference(p: &TopicPattern, topic: &str) -> Result<TopicParts, TopicError> {
        let (mut group, mut device, mut kind) = (None, None, None);
        let mut levels = topic.split('/');
        for seg in &p.segments {
            let level = levels.next().ok_or(TopicError::Levels)?;
            match seg {
                Segment::Literal(l) if l != level => return Err(TopicError::Literal),
                Segment::Literal(_) => {}
                Segment::Group => group = Some(level),
                Segment::Device => device = Some(level),
                Segment::Kind => kind = Some(level),
            }
        }
        if levels.next().is_some() {
            return Err(TopicError::Levels);
        }
        parts(group, device, kind)
    }

    proptest::proptest! {
        #[test]
        fn levels_cut_as_split_cuts_them(
            levels in proptest::collection::vec("(sensors|site|x|reading|heartbeat|[a-z/é]{0,4})", 0..7),
            pattern in 0usize..3,
        ) {
            let p = TopicPattern::parse(["sensors/{group}/{device}/{kind}", "site/{kind}/{device}/x/{group}", "{device}/{group}/{kind}"][pattern]).unwrap();
            let t = levels.join("/");
            let parsed = p.parse_topic(&t);
            proptest::prop_assert_eq!(&parsed, &split_reference(&p, &t));
            // The look-ahead's guess names the same ids whenever the topic matches.
            if let Ok(parts) = parsed {
                proptest::prop_assert_eq!(p.ids(&t), Some((parts.group.as_str(), parts.device.as_str())));
            }
        }

        #[test]
        fn arbitrary_topics_never_panic(t in "\\PC{0,80}", levels in proptest::collection::vec("[a-z{}+#/$.:-]{0,6}", 0..6)) {
            let p = build_default();
            let _ = p.parse_topic(&t);
            let _ = p.parse_topic(&levels.join("/"));
            let _ = TopicPattern::parse(&t);
            let _ = validate_filter(&t);
        }
    }
}
