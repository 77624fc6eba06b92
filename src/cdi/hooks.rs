//! The NVIDIA hooks gpuhook does itself, recognised from their arguments.

use super::error::HookError;
use super::model::Link;
use super::plan::container_path;
use std::path::Path;

/// What an NVIDIA hook gpuhook does itself asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Native {
    /// `create-symlinks --link TARGET::LINK …`
    Links(Vec<Link>),
    /// `update-ldcache --folder DIR …`
    Ldcache(Vec<String>),
}

/// The name the crate exports it by.
pub type NativeHook = Native;

/// The two NVIDIA hooks gpuhook does itself: `nvidia-cdi-hook create-symlinks --link T::L …`
/// and `update-ldcache --folder D …` (also as `nvidia-ctk hook …`, and as `gpuhook cdi-hook
/// …`, which `gpuhook cdi generate` writes). Any other hook, or one with flags gpuhook does
/// not know, is `None` (passed on).
pub(super) fn native(path: &str, args: &[String]) -> Result<Option<Native>, HookError> {
    let prog = Path::new(path).file_name().and_then(|f| f.to_str());
    let rest: &[String] = match prog {
        Some("nvidia-cdi-hook") if args.len() >= 2 => &args[1..],
        Some("nvidia-ctk") if args.len() >= 3 && args[1] == "hook" => &args[2..],
        Some(p)
            if p.starts_with("gpuhook") && args.len() >= 3 && args[1] == super::model::CDI_HOOK =>
        {
            &args[2..]
        }
        _ => return Ok(None),
    };
    parse_rest(rest)
}

/// `gpuhook cdi-hook SUB FLAGS…` run as an OCI hook: what it is to do, or why not (a
/// subcommand or flag it does not know is an error here).
pub fn parse_native(rest: &[String]) -> Result<Native, HookError> {
    parse_rest(rest)?.ok_or_else(|| HookError::NotNative(rest.join(" ")))
}

fn parse_rest(rest: &[String]) -> Result<Option<Native>, HookError> {
    if rest.is_empty() {
        return Ok(None);
    }
    let (sub, want) = match rest[0].as_str() {
        "create-symlinks" => ("create-symlinks", "link"),
        "update-ldcache" => ("update-ldcache", "folder"),
        _ => return Ok(None),
    };
    let flags = &rest[1..];
    let mut values = Vec::new();
    let mut it = flags.iter();
    while let Some(a) = it.next() {
        let name = a.trim_start_matches('-');
        let (name, value) = match name.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (name, None),
        };
        if !a.starts_with("--") {
            return Ok(None);
        }
        match name {
            n if n == want => {
                let v = match value {
                    Some(v) => v,
                    None => it
                        .next()
                        .cloned()
                        .ok_or(HookError::NoValue { sub, flag: want })?,
                };
                values.push(v);
            }
            // The container's root is gpuhook's to find; ldconfig is the host's.
            "ldconfig-path" | "container-spec" => {
                if value.is_none() {
                    it.next();
                }
            }
            _ => return Ok(None),
        }
    }
    Ok(Some(match sub {
        "create-symlinks" => Native::Links(
            values
                .into_iter()
                .map(|v| {
                    let (target, link) = v
                        .split_once("::")
                        .ok_or_else(|| HookError::NotTargetLink(v.clone()))?;
                    container_path(link, "create-symlinks link")?;
                    if target.is_empty() || target.contains('\0') || target.len() > 4096 {
                        return Err(HookError::BadTarget(target.to_string()));
                    }
                    Ok(Link {
                        target: target.to_string(),
                        link: link.trim_end_matches('/').to_string(),
                    })
                })
                .collect::<Result<_, HookError>>()?,
        ),
        _ => Native::Ldcache(
            values
                .into_iter()
                .map(|v| {
                    container_path(&v, "update-ldcache folder")
                        .map(|r| format!("/{r}"))
                        .map_err(HookError::from)
                })
                .collect::<Result<_, HookError>>()?,
        ),
    }))
}
