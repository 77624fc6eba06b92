//! What a rollback could not undo ([`Leftovers`]): a base type every room's rollback keeps.

/// What a rollback could not undo, each in its own words: the one record every step that
/// takes back its work keeps (device-cgroup grants, nodes in a container's `/dev`, CDI
/// mounts, links and files), said on the failure's one line. It crosses the fork from the
/// container helper as a serde value.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Leftovers(Vec<String>);

impl Leftovers {
    /// One more thing not undone.
    pub fn push(&mut self, what: impl std::fmt::Display) {
        self.0.push(what.to_string());
    }
    /// Another step's leftovers, after these.
    pub fn append(&mut self, mut other: Leftovers) {
        self.0.append(&mut other.0);
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }
    /// `""`, or `"; rollback incomplete: …"`: said after the failure the rollback followed.
    pub fn note(&self) -> String {
        if self.is_empty() {
            String::new()
        } else {
            format!("; rollback incomplete: {self}")
        }
    }
}

/// The leftovers, `; `-separated.
impl std::fmt::Display for Leftovers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join("; "))
    }
}

impl FromIterator<String> for Leftovers {
    fn from_iter<I: IntoIterator<Item = String>>(it: I) -> Self {
        Leftovers(it.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::Leftovers;

    #[test]
    fn leftovers_read_as_before() {
        let mut l = Leftovers::default();
        assert_eq!(l.note(), "");
        l.push("cgroup /fake: No such file or directory");
        l.append(
            ["mount /usr/lib/x: EBUSY".to_string()]
                .into_iter()
                .collect(),
        );
        assert_eq!(
            l.note(),
            "; rollback incomplete: cgroup /fake: No such file or directory; mount /usr/lib/x: EBUSY"
        );
        assert_eq!(
            serde_json::to_string(&l).unwrap(),
            r#"["cgroup /fake: No such file or directory","mount /usr/lib/x: EBUSY"]"#
        );
    }
}
