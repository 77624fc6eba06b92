//! The NVIDIA hooks gpuhook does itself, recognised from their arguments.

use super::error::HookError;
use super::plan::container_path;
use super::Link;
use std::path::Path;

pub(super) enum Native {
    Links(Vec<Link>),
    Ldcache(Vec<String>),
}

/// The two NVIDIA hooks gpuhook does itself: `nvidia-cdi-hook create-symlinks --link T::L …`
/// and `update-ldcache --folder D …` (also as `nvidia-ctk hook …`). Any other hook, or one
/// with flags gpuhook does not know, is `None` (passed on).
pub(super) fn native(path: &str, args: &[String]) -> Result<Option<Native>, HookError> {
    let prog = Path::new(path).file_name().and_then(|f| f.to_str());
    let rest: &[String] = match prog {
        Some("nvidia-cdi-hook") if args.len() >= 2 => &args[1..],
        Some("nvidia-ctk") if args.len() >= 3 && args[1] == "hook" => &args[2..],
        _ => return Ok(None),
    };
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
