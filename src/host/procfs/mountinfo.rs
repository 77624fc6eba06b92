//! Mount tables (`/proc/PID/mountinfo`, `proc(5)`), read as bytes.

/// One line of a `mountinfo` file (`proc(5)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The filesystem's device (`st_dev` of every file on it), from `major:minor`.
    pub dev: u64,
    /// The directory of the filesystem that is mounted (`/` for its whole tree).
    pub root: String,
    pub mount_point: String,
    pub fs_type: String,
    pub super_options: String,
}

/// Parses `mountinfo` text: `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw`.
/// Lines that do not parse are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            let (maj, min) = pre.get(2)?.split_once(':')?;
            Some(Mount {
                dev: libc::makedev(maj.parse().ok()?, min.parse().ok()?),
                root: unescape_mount(pre.get(3)?),
                mount_point: unescape_mount(pre.get(4)?),
                fs_type: post.first()?.to_string(),
                super_options: post.get(2).unwrap_or(&"").to_string(),
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push(
                u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 4]).unwrap_or("0"), 8)
                    .unwrap_or(b'?'),
            );
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
