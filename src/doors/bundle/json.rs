//! The few JSON shapes the edits build and look for in a `config.json`: an object or a list
//! made where missing, a device's number, an allow rule.

use super::error::BundleError;
use serde_json::{json, Map, Value};

pub(super) fn not_object(at: impl Into<String>) -> BundleError {
    BundleError::NotObject { at: at.into() }
}

pub(super) fn object<'a>(
    parent: &'a mut Value,
    key: &str,
    what: &str,
) -> Result<&'a mut Map<String, Value>, BundleError> {
    let m = parent.as_object_mut().ok_or_else(|| not_object(what))?;
    m.entry(key)
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| not_object(format!("{what}.{key}")))
}

pub(super) fn array<'a>(
    parent: &'a mut Map<String, Value>,
    key: &str,
    what: &str,
) -> Result<&'a mut Vec<Value>, BundleError> {
    parent
        .entry(key)
        .or_insert_with(|| Value::Array(Vec::new()))
        .as_array_mut()
        .ok_or_else(|| BundleError::NotList {
            at: format!("{what}.{key}"),
        })
}

pub(super) fn allow_rule(major: u32, minor: u32) -> Value {
    json!({"allow": true, "type": "c", "major": major, "minor": minor, "access": "rw"})
}

pub(super) fn device_number(d: &Value) -> Option<(u32, u32)> {
    let n = |k: &str| {
        d.get(k)
            .and_then(Value::as_u64)
            .and_then(|x| u32::try_from(x).ok())
    };
    Some((n("major")?, n("minor")?))
}
