//! The expression language: errors with their column, precedence, absent
//! values, and a property test against a direct evaluation of random trees.

use proptest::prelude::*;

use super::*;

fn values(e: &Expr, v: &[(&str, f64)]) -> impl Fn(usize) -> Option<f64> {
    let got: Vec<Option<f64>> = e
        .refs()
        .iter()
        .map(|r| v.iter().find(|(n, _)| *n == r.to_string()).map(|(_, x)| *x))
        .collect();
    move |i| got[i]
}

fn holds(src: &str, v: &[(&str, f64)]) -> bool {
    let e = Expr::parse(src).unwrap_or_else(|e| panic!("{src}: {e}"));
    e.eval(values(&e, v))
}

#[test]
fn the_examples_of_the_reference_parse_and_judge() {
    let v = [("temp.mean", 81.2), ("temp.p95", 86.0), ("count", 12.0)];
    assert!(holds("temp.mean > 80 and temp.p95 > 85", &v));
    assert!(!holds("temp.mean < 75", &v));
    assert!(holds("temp.stddev == 0 or count >= 12", &v));
    assert!(holds("not (temp.mean > 90) and -5 < temp.mean", &v));
    assert!(holds("temp.mean>=81.2 and 1e1<count", &v));
    let e = Expr::parse("temp.mean > 80 and temp.p95 > 85 or temp.mean > 80").unwrap();
    assert_eq!(e.refs().len(), 2, "each value read once: {:?}", e.refs());
}

#[test]
fn not_binds_tighter_than_and_and_than_or() {
    let v = [("a.max", 1.0), ("b.max", 0.0), ("c.max", 1.0)];
    // or(and(a, b), c) = true; and(a, or(b, c)) would be true too: use not to tell apart.
    assert!(holds("a.max > 0 and b.max > 0 or c.max > 0", &v));
    assert!(!holds("a.max > 0 and (b.max > 0 or c.max > 5)", &v));
    assert!(!holds("not a.max > 0 and c.max > 0", &v));
    assert!(holds("not (a.max > 0 and b.max > 0)", &v));
}

#[test]
fn a_comparison_with_an_absent_value_is_false_both_ways() {
    let v = [("temp.mean", 5.0)];
    assert!(!holds("temp.rate > 0", &v));
    assert!(!holds("temp.rate <= 0", &v));
    assert!(holds("not temp.rate > 0", &v));
    assert!(!holds("temp.rate != temp.rate", &v));
}

#[test]
fn errors_name_the_column() {
    for (src, column, want) in [
        ("temp.mean > ", 13, "expected a value"),
        ("temp.avg > 1", 1, "\"avg\" is not an aggregate"),
        ("temp > 1", 1, "expected FIELD.AGG"),
        ("temp.mean >> 1", 12, "expected a value"),
        ("(temp.mean > 1", 15, "expected )"),
        (
            "temp.mean > 1 xor count > 1",
            15,
            "expected and, or, or the end",
        ),
        ("temp.mean = 1", 11, "unexpected '='"),
        ("count > 1e999", 9, "is not a number"),
        ("", 1, "empty expression"),
        ("count", 6, "expected a comparison"),
    ] {
        let e = Expr::parse(src).expect_err(src);
        assert_eq!(e.column, column, "{src}: {e}");
        assert!(e.message.contains(want), "{src}: {e}");
    }
    let deep = format!("{}count > 1{}", "(".repeat(40), ")".repeat(40));
    assert!(
        Expr::parse(&deep)
            .unwrap_err()
            .message
            .contains("nested deeper")
    );
}

/// A random boolean tree over three values, printed and judged directly.
#[derive(Debug, Clone)]
enum Tree {
    Cmp(usize, usize, f64),
    Not(Box<Tree>),
    And(Box<Tree>, Box<Tree>),
    Or(Box<Tree>, Box<Tree>),
}

const NAMES: [&str; 3] = ["t.mean", "t.p99", "count"];
const OPS: [&str; 6] = [">", ">=", "<", "<=", "==", "!="];

fn tree() -> impl Strategy<Value = Tree> {
    let leaf = (0usize..3, 0usize..6, -3i32..4).prop_map(|(a, c, n)| Tree::Cmp(a, c, f64::from(n)));
    leaf.prop_recursive(6, 48, 2, |inner| {
        prop_oneof![
            inner.clone().prop_map(|t| Tree::Not(Box::new(t))),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| Tree::And(Box::new(a), Box::new(b))),
            (inner.clone(), inner).prop_map(|(a, b)| Tree::Or(Box::new(a), Box::new(b))),
        ]
    })
}

fn print(t: &Tree) -> String {
    match t {
        Tree::Cmp(a, c, n) => format!("{} {} {n}", NAMES[*a], OPS[*c]),
        Tree::Not(x) => format!("not ({})", print(x)),
        Tree::And(a, b) => format!("({}) and ({})", print(a), print(b)),
        Tree::Or(a, b) => format!("({}) or ({})", print(a), print(b)),
    }
}

fn judge(t: &Tree, v: &[Option<f64>; 3]) -> bool {
    match t {
        Tree::Cmp(a, c, n) => v[*a].is_some_and(|x| match *c {
            0 => x > *n,
            1 => x >= *n,
            2 => x < *n,
            3 => x <= *n,
            4 => x == *n,
            _ => x != *n,
        }),
        Tree::Not(x) => !judge(x, v),
        Tree::And(a, b) => judge(a, v) && judge(b, v),
        Tree::Or(a, b) => judge(a, v) || judge(b, v),
    }
}

proptest! {
    #[test]
    fn parsed_expressions_judge_as_their_trees(
        t in tree(),
        v in prop::array::uniform3(prop::option::of(-3i32..4)),
    ) {
        let v = v.map(|x| x.map(f64::from));
        let src = print(&t);
        let e = Expr::parse(&src).map_err(|e| TestCaseError::fail(format!("{src}: {e}")))?;
        let got = e.eval(|i| {
            let name = e.refs()[i].to_string();
            NAMES.iter().position(|n| *n == name).and_then(|k| v[k])
        });
        prop_assert_eq!(got, judge(&t, &v), "{}", src);
    }
}
