//! `[[groups.NAME.conditions]]` (docs/conditions.md): names, runs and
//! expressions checked once, each problem naming its key and the column.

use super::checks::Problems;
use crate::engine::conditions::{
    Condition, ConditionDef, MAX_FOR_WINDOWS, MAX_PER_GROUP, valid_name,
};
use crate::engine::expr::{Expr, Ref};
use crate::time::extras::Extras;

/// The group's conditions; problems added to `p`.
pub(super) fn conditions(
    p: &mut Problems,
    key: &str,
    defs: &[ConditionDef],
    extras: Extras,
) -> Vec<Condition> {
    if defs.len() > MAX_PER_GROUP {
        p.add(
            &format!("{key}.conditions"),
            format!(
                "{} conditions: at most {MAX_PER_GROUP} a group (each device keeps a judge for each)",
                defs.len()
            ),
        );
    }
    let mut out: Vec<Condition> = Vec::with_capacity(defs.len().min(MAX_PER_GROUP));
    for (i, def) in defs.iter().enumerate() {
        let k = format!("{key}.conditions[{i}]");
        if !valid_name(&def.name) {
            p.add(
                &format!("{k}.name"),
                format!("{:?} must be 1..64 chars of [A-Za-z0-9_-]", def.name),
            );
        }
        if out.iter().any(|c| c.name() == def.name) {
            p.add(
                &format!("{k}.name"),
                format!("{:?} is the name of an earlier condition", def.name),
            );
        }
        if !(1..=MAX_FOR_WINDOWS).contains(&def.for_windows) {
            p.add(
                &format!("{k}.for_windows"),
                format!("{} must be 1..={MAX_FOR_WINDOWS}", def.for_windows),
            );
        }
        let exprs = [("when", Some(&def.when)), ("clear", def.clear.as_ref())];
        let mut ok = true;
        for (field, src) in exprs {
            let Some(src) = src else { continue };
            match Expr::parse(src) {
                Err(e) => {
                    ok = false;
                    p.add(&format!("{k}.{field}"), format!("{e} in {src:?}"));
                }
                Ok(e) => unknown_aggregates(p, (&k, field, key), src, &e, extras),
            }
        }
        if ok && let Ok(c) = Condition::parse(def.clone()) {
            out.push(c);
        }
    }
    out
}

/// A metric aggregate the group does not compute is an error, named with its column.
fn unknown_aggregates(
    p: &mut Problems,
    (k, field, key): (&str, &str, &str),
    src: &str,
    e: &Expr,
    extras: Extras,
) {
    for r in e.refs() {
        let Ref::Metric(_, agg) = r else { continue };
        if agg.always() || extras.has(agg.name()) {
            continue;
        }
        let text = r.to_string();
        let column = src.find(&text).map_or(1, |b| src[..b].chars().count() + 1);
        p.add(
            &format!("{k}.{field}"),
            format!(
                "at column {column}: {text} reads {}, which the group does not compute (add it to {key}.aggregates)",
                agg.name()
            ),
        );
    }
}
