//! OpenStack Nova flavor extra_specs, as the original *HeterogeneousGpuAcceleratorSupport*
//! blueprint used them (`gpus` `= 2`, `gpu_arch` `s== fermi`).
//!
//! Nova's operators (`nova/scheduler/filters/extra_specs_ops.py`): `=` (numeric ≥), `==`, `!=`,
//! `>=`, `<=` (numeric), `s==`, `s!=`, `s<`, `s<=`, `s>`, `s>=` (string), `<in>` (substring),
//! `<or>` (one of). A value without a known operator is compared as a whole string.
//! Unlike Nova, the operand of a string operator is the whole rest of the value, so
//! `s== Tesla M2050` compares against `Tesla M2050`, not just `Tesla`. Comparisons are
//! case-insensitive, as architecture names are everywhere (docs/guides/libvirt.md).

use std::fmt;

/// A string predicate on a GPU property (vendor, architecture or model name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Eq(String),
    Ne(String),
    Lt(String),
    Le(String),
    Gt(String),
    Ge(String),
    Contains(String),
    OneOf(Vec<String>),
    /// The GPU's architecture as Placement names it (`CUSTOM_GPU_FERMI`): the form a flavor's
    /// `resources:CUSTOM_GPU_<ARCH>` names, matched by [`custom_name`] so
    /// that the hook takes exactly the GPUs `gpuhook placement` counted in that class.
    Class(String),
}

impl Op {
    /// Whether `value` satisfies the predicate. An unknown value (`None`) never matches,
    /// as in Nova where a missing capability fails every operator.
    pub fn matches(&self, value: Option<&str>) -> bool {
        let Some(value) = value else { return false };
        if let Op::Class(c) = self {
            return custom_name("GPU_", value) == *c;
        }
        let v = value.to_ascii_lowercase();
        match self {
            Op::Eq(x) => v == *x,
            Op::Ne(x) => v != *x,
            Op::Lt(x) => v.as_str() < x.as_str(),
            Op::Le(x) => v.as_str() <= x.as_str(),
            Op::Gt(x) => v.as_str() > x.as_str(),
            Op::Ge(x) => v.as_str() >= x.as_str(),
            Op::Contains(x) => v.contains(x.as_str()),
            Op::OneOf(xs) => xs.contains(&v),
            Op::Class(_) => false,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Eq(x) => write!(f, "== {x}"),
            Op::Ne(x) => write!(f, "!= {x}"),
            Op::Lt(x) => write!(f, "< {x}"),
            Op::Le(x) => write!(f, "<= {x}"),
            Op::Gt(x) => write!(f, "> {x}"),
            Op::Ge(x) => write!(f, ">= {x}"),
            Op::Contains(x) => write!(f, "contains {x}"),
            Op::OneOf(xs) => write!(f, "one of {}", xs.join("|")),
            Op::Class(c) => write!(f, "in resource class {c}"),
        }
    }
}

const NUMERIC_OPS: [&str; 5] = ["=", "==", "!=", ">=", "<="];

/// Splits `value` into (operator, operand) when it starts with one of Nova's operators.
fn split_op(value: &str) -> Option<(&str, &str)> {
    let value = value.trim();
    let (first, rest) = match value.split_once(char::is_whitespace) {
        Some((a, b)) => (a, b.trim()),
        None => (value, ""),
    };
    const OPS: [&str; 13] = [
        "=", "==", "!=", ">=", "<=", "s==", "s!=", "s<", "s<=", "s>", "s>=", "<in>", "<or>",
    ];
    OPS.contains(&first).then_some((first, rest))
}

/// What is wrong with the value of an extra spec (or a count attribute); the caller names
/// the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("operator '{0}' without a number")]
    OpWithoutNumber(String),
    #[error("operator '{0}' does not name a number of GPUs; use '= N'")]
    OpNotACount(String),
    #[error("empty count")]
    EmptyCount,
    #[error("count '{0}' is negative")]
    NegativeCount(String),
    #[error("count '{0}' is not a whole number")]
    CountNotWhole(String),
    #[error("count must be at least 1")]
    ZeroCount,
    #[error("count {0} is too large (at most {MAX_COUNT})")]
    CountTooLarge(String),
    #[error("amount '{0}' is not a whole number")]
    AmountNotWhole(String),
    #[error("amount '{0}' is negative")]
    NegativeAmount(String),
    #[error("empty value")]
    EmptyValue,
    #[error("'<or>' without alternatives")]
    OrWithoutAlternatives,
    /// A numeric operator on a name (`=`, `<`, …): the message names the `s…` one to use.
    #[error("operator '{op}' compares numbers; use 's{}' to compare names", if .op == "=" { "==" } else { .op.as_str() })]
    NumericOp { op: String },
    #[error("operator '{0}' without a value")]
    OpWithoutValue(String),
    #[error("operator '{0}' is not supported here")]
    UnsupportedOp(String),
}

/// Parses the value of the `gpus` key: how many GPUs to reserve.
///
/// `= N` (Nova: at least N, the blueprint's form), `== N`, `>= N`, `s== N` and a bare `N`
/// all reserve exactly N. Operators that do not name one count (`!=`, `<=`, `<in>`, …)
/// are refused rather than guessed.
pub fn parse_count(value: &str) -> Result<u32, ValueError> {
    parse_count_bound(value).map(|(n, _)| n)
}

/// [`parse_count`], and whether Nova reads the value as "at least N" (`= N`, `>= N`):
/// beside Placement's `resources…` keys, which name the number, that is a lower bound.
pub fn parse_count_bound(value: &str) -> Result<(u32, bool), ValueError> {
    let at_least = matches!(split_op(value), Some(("=" | ">=", _)));
    let operand = match split_op(value) {
        Some((op @ ("=" | "==" | ">=" | "s=="), rest)) => {
            if rest.is_empty() {
                return Err(ValueError::OpWithoutNumber(op.to_string()));
            }
            rest
        }
        Some((op, _)) => return Err(ValueError::OpNotACount(op.to_string())),
        None => value.trim(),
    };
    parse_positive_count(operand).map(|n| (n, at_least))
}

/// Largest number of GPUs one domain may ask for. Hosts have tens; this bound keeps
/// absurd requests a clear error instead of an allocation attempt.
pub const MAX_COUNT: u32 = 1024;

/// A decimal count in 1..=MAX_COUNT, digits only.
pub fn parse_positive_count(s: &str) -> Result<u32, ValueError> {
    if s.is_empty() {
        return Err(ValueError::EmptyCount);
    }
    if let Some(rest) = s.strip_prefix('-') {
        if !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ValueError::NegativeCount(s.to_string()));
        }
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ValueError::CountNotWhole(s.to_string()));
    }
    let digits = s.trim_start_matches('0');
    if digits.is_empty() {
        return Err(ValueError::ZeroCount);
    }
    match digits.parse::<u32>() {
        Ok(n) if n <= MAX_COUNT => Ok(n),
        _ => Err(ValueError::CountTooLarge(s.to_string())),
    }
}

/// The resource class of a Placement request key, `resources[GROUP]:CUSTOM_GPU_<ARCH>`
/// (Nova's granular groups: `resources1:…`, `resources_gpu:…`), when `key` is one that
/// names GPUs; `None` for every other key (`resources:VCPU`, `hw:…`).
/// The suffix of the Placement classes of shareable GPUs' slots (`CUSTOM_GPU_FERMI_SHARED`).
pub const SHARED_SUFFIX: &str = "_SHARED";

pub fn gpu_resource_class(key: &str) -> Option<&str> {
    let (group, class) = key.split_once(':')?;
    let suffix = group.strip_prefix("resources")?;
    let group_ok = suffix.len() <= 64
        && suffix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    (group_ok && class.starts_with("CUSTOM_GPU_")).then_some(class)
}

/// The amount of a `resources…:CLASS` key, read as Nova reads it (Python's `int()`: an
/// optional sign, `_` between digits); `0` drops the resource from the request (Nova's way
/// to unset an inherited one).
pub fn parse_amount(value: &str) -> Result<u32, ValueError> {
    let v = value.trim();
    let (neg, body) = match v.as_bytes().first() {
        Some(b'-') => (true, &v[1..]),
        Some(b'+') => (false, &v[1..]),
        _ => (false, v),
    };
    let underscores_ok = !body.starts_with('_') && !body.ends_with('_') && !body.contains("__");
    let digits: String = body.chars().filter(|c| *c != '_').collect();
    if !underscores_ok || digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ValueError::AmountNotWhole(v.to_string()));
    }
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Ok(0);
    }
    if neg {
        return Err(ValueError::NegativeAmount(v.to_string()));
    }
    parse_positive_count(digits)
}

/// Parses the value of a string key (`gpu_arch`, `gpu_model`, `gpu_vendor`).
pub fn parse_string_op(value: &str) -> Result<Op, ValueError> {
    let lower = value.trim().to_ascii_lowercase();
    let Some((op, rest)) = split_op(&lower) else {
        if lower.is_empty() {
            return Err(ValueError::EmptyValue);
        }
        return Ok(Op::Eq(lower));
    };
    if op == "<or>" {
        let alts: Vec<String> = lower
            .split("<or>")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        if alts.is_empty() {
            return Err(ValueError::OrWithoutAlternatives);
        }
        return Ok(Op::OneOf(alts));
    }
    if NUMERIC_OPS.contains(&op) {
        return Err(ValueError::NumericOp { op: op.to_string() });
    }
    if rest.is_empty() {
        return Err(ValueError::OpWithoutValue(op.to_string()));
    }
    let rest = rest.to_owned();
    Ok(match op {
        "s==" => Op::Eq(rest),
        "s!=" => Op::Ne(rest),
        "s<" => Op::Lt(rest),
        "s<=" => Op::Le(rest),
        "s>" => Op::Gt(rest),
        "s>=" => Op::Ge(rest),
        "<in>" => Op::Contains(rest),
        _ => return Err(ValueError::UnsupportedOp(op.to_string())),
    })
}

/// A Placement custom name: `CUSTOM_` + the upper-cased name, anything but `A-Z0-9_` as `_`
/// (Placement: `^CUSTOM_[A-Z0-9_]+$`, at most 255 characters).
pub fn custom_name(prefix: &str, name: &str) -> String {
    let body: String = name
        .chars()
        .map(|c| match c.to_ascii_uppercase() {
            c @ ('A'..='Z' | '0'..='9' | '_') => c,
            _ => '_',
        })
        .collect();
    let mut n = format!("CUSTOM_{prefix}{body}");
    n.truncate(255);
    n
}

/// Whether Placement accepts `n` as a custom resource class or trait name.
pub fn valid_custom_name(n: &str) -> bool {
    n.len() <= 255
        && n.strip_prefix("CUSTOM_").is_some_and(|b| {
            !b.is_empty()
                && b.bytes()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blueprint_count_forms() {
        assert_eq!(parse_count("= 2"), Ok(2));
        assert_eq!(parse_count("== 4"), Ok(4));
        assert_eq!(parse_count(">= 1"), Ok(1));
        assert_eq!(parse_count("s== 3"), Ok(3));
        assert_eq!(parse_count(" 8 "), Ok(8));
        assert_eq!(parse_count("=   2"), Ok(2));
    }

    #[test]
    fn bad_counts() {
        for bad in [
            "",
            "= ",
            "=",
            "0",
            "= 0",
            "-1",
            "= -2",
            "2.0",
            "two",
            "= 1e3",
            "99999999999",
            "= 1025",
            "!= 2",
            "<= 2",
            "<in> 2",
            "<or> 1 <or> 2",
            "s< 3",
        ] {
            assert!(parse_count(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_count("-1")
            .unwrap_err()
            .to_string()
            .contains("negative"));
        assert!(parse_count("0")
            .unwrap_err()
            .to_string()
            .contains("at least 1"));
        assert!(parse_count("= 1025")
            .unwrap_err()
            .to_string()
            .contains("too large"));
        assert_eq!(parse_count("= 1024"), Ok(1024));
    }

    #[test]
    fn string_operators() {
        assert_eq!(parse_string_op("s== fermi"), Ok(Op::Eq("fermi".into())));
        assert_eq!(parse_string_op("s== Fermi"), Ok(Op::Eq("fermi".into())));
        assert_eq!(parse_string_op("fermi"), Ok(Op::Eq("fermi".into())));
        assert_eq!(
            parse_string_op("s== Tesla M2050"),
            Ok(Op::Eq("tesla m2050".into()))
        );
        assert_eq!(parse_string_op("s!= kepler"), Ok(Op::Ne("kepler".into())));
        assert_eq!(parse_string_op("<in> M20"), Ok(Op::Contains("m20".into())));
        assert_eq!(
            parse_string_op("<or> fermi <or> kepler"),
            Ok(Op::OneOf(vec!["fermi".into(), "kepler".into()]))
        );
        assert_eq!(parse_string_op("s>= b"), Ok(Op::Ge("b".into())));
        assert!(parse_string_op("= fermi")
            .unwrap_err()
            .to_string()
            .contains("s=="));
        assert!(parse_string_op("== fermi").is_err());
        assert!(parse_string_op("s==").is_err());
        assert!(parse_string_op("<or>").is_err());
        assert!(parse_string_op("  ").is_err());
    }

    #[test]
    fn placement_keys() {
        assert_eq!(
            gpu_resource_class("resources:CUSTOM_GPU_FERMI"),
            Some("CUSTOM_GPU_FERMI")
        );
        assert_eq!(
            gpu_resource_class("resources1:CUSTOM_GPU_XE_HPC"),
            Some("CUSTOM_GPU_XE_HPC")
        );
        assert_eq!(
            gpu_resource_class("resources_gpu-a:CUSTOM_GPU_A"),
            Some("CUSTOM_GPU_A")
        );
        for other in [
            "resources:VCPU",
            "resources:CUSTOM_GPUX",
            "resources:VGPU",
            "trait:CUSTOM_GPU_ARCH_FERMI",
            "hw:cpu_policy",
            "resources/x:CUSTOM_GPU_FERMI",
            "xresources:CUSTOM_GPU_FERMI",
            "gpus",
        ] {
            assert_eq!(gpu_resource_class(other), None, "{other}");
        }
        // As Python's int() reads them, which is what Nova does.
        for (v, n) in [
            (" 2 ", 2),
            ("0", 0),
            ("00", 0),
            ("-0", 0),
            ("+0", 0),
            ("0_0", 0),
            ("+2", 2),
            ("1_0", 10),
        ] {
            assert_eq!(parse_amount(v), Ok(n), "{v}");
        }
        for bad in [
            "-1", "two", "", "2000", "_1", "1_", "1__0", "+", "-", "1.0", "２",
        ] {
            assert!(parse_amount(bad).is_err(), "{bad}");
        }
        assert!(parse_amount("-1")
            .unwrap_err()
            .to_string()
            .contains("negative"));
        assert_eq!(parse_count_bound("= 2"), Ok((2, true)));
        assert_eq!(parse_count_bound(">= 2"), Ok((2, true)));
        assert_eq!(parse_count_bound("== 2"), Ok((2, false)));
        assert_eq!(parse_count_bound("2"), Ok((2, false)));
    }

    #[test]
    fn class_matching() {
        let c = Op::Class("CUSTOM_GPU_XE_HPC".into());
        assert!(c.matches(Some("xe-hpc")));
        assert!(!c.matches(Some("xe")));
        assert!(!c.matches(None));
        assert!(Op::Class("CUSTOM_GPU_FERMI".into()).matches(Some("Fermi")));
        assert_eq!(c.to_string(), "in resource class CUSTOM_GPU_XE_HPC");
    }

    #[test]
    fn matching() {
        let op = parse_string_op("s== fermi").unwrap();
        assert!(op.matches(Some("Fermi")));
        assert!(!op.matches(Some("kepler")));
        assert!(!op.matches(None));
        assert!(Op::Ne("fermi".into()).matches(Some("kepler")));
        assert!(!Op::Ne("fermi".into()).matches(None));
        assert!(Op::Contains("m20".into()).matches(Some("Tesla M2050")));
        assert!(Op::OneOf(vec!["a".into(), "b".into()]).matches(Some("B")));
        assert!(Op::Lt("kepler".into()).matches(Some("fermi")));
        assert!(!Op::Gt("kepler".into()).matches(Some("fermi")));
    }

    /// The messages as they were written before they were a type.
    #[test]
    fn value_error_messages() {
        let msg = |r: Result<u32, ValueError>| r.unwrap_err().to_string();
        assert_eq!(
            parse_string_op("= fermi").unwrap_err().to_string(),
            "operator '=' compares numbers; use 's==' to compare names"
        );
        assert_eq!(
            parse_string_op(">= b").unwrap_err().to_string(),
            "operator '>=' compares numbers; use 's>=' to compare names"
        );
        assert_eq!(
            msg(parse_count("!= 2")),
            "operator '!=' does not name a number of GPUs; use '= N'"
        );
        assert_eq!(msg(parse_count("=")), "operator '=' without a number");
        assert_eq!(
            msg(parse_count("= 1025")),
            "count 1025 is too large (at most 1024)"
        );
        assert_eq!(
            msg(parse_positive_count("2.5")),
            "count '2.5' is not a whole number"
        );
        assert_eq!(msg(parse_amount("-1")), "amount '-1' is negative");
        assert_eq!(
            msg(parse_amount("1__0")),
            "amount '1__0' is not a whole number"
        );
    }

    /// `capabilities` and `driver` messages, as they were written before they were a type.
    #[test]
    fn word_error_messages() {
        use crate::request::{Capabilities, Driver};
        assert_eq!(
            Capabilities::parse("compute,,video")
                .unwrap_err()
                .to_string(),
            "empty entry in capabilities 'compute,,video'"
        );
        assert_eq!(
            Capabilities::parse("compute,display")
                .unwrap_err()
                .to_string(),
            "unknown capability 'display' (known: compute, utility, graphics, video)"
        );
        assert_eq!(
            Driver::parse(" NVIDIA ").unwrap_err().to_string(),
            "unknown driver 'nvidia' (known: none, cdi, host)"
        );
    }
}
