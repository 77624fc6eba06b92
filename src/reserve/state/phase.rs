//! A reservation's phase, and the one table of the steps that change it (as youki's
//! `ContainerStatus::can_start`, `can_delete`, …): every step asks [`Transition::from`] before it
//! changes a reservation, instead of looking at the phase itself.
//!
//! | step | none | prepared | prepared, another's create lives | running, init gone | running, init lives |
//! |---|---|---|---|---|---|
//! | `Prepare` | prepared | prepared | refused (`Creating`) | prepared | refused (`Runs`) |
//! | `Start` | refused (`NoReservation`) | running | running | running | running |
//! | `RecordInit` | refused (`NoReservation`) | running | running | refused (`Runs`) | refused (`Runs`) |
//! | `Reconnect` | running | running | running | running | running |
//! | `Attach` | running | refused (`NotRunning`) | refused (`NotRunning`) | running | running |
//! | `Detach` | refused (`NoReservation`) | refused (`NotRunning`) | refused (`NotRunning`) | running | running |
//! | `Release` | refused (`NoReservation`) | freed | freed | freed | refused (`Runs`) |
//! | `Stop` | freed | freed | freed | freed | freed |
//!
//! Whether the holder lives is the step's to say ([`Found::live`]): libvirt runs one step of
//! a domain at a time, so its `prepare` never meets a live holder of its own (it passes
//! `false`); an OCI `create` of an ID whose container runs, or is being created by another
//! `create`, does.

use crate::host::procfs::ProcRef;
use crate::node::Node;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Reserved at `prepare`; no container yet.
    Prepared,
    /// The container runs with its GPUs (`started` or `reconnect` done).
    Running,
}

impl Phase {
    /// As listings and messages say it: `prepared`, `running`.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Prepared => "prepared",
            Phase::Running => "running",
        }
    }
}

/// A lifecycle step, as the transition table knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// libvirt `prepare`, OCI `create`: a reservation made, or kept and prepared again.
    Prepare,
    /// libvirt `started`: the container runs with its GPUs.
    Start,
    /// OCI `createRuntime`: the container's init exists.
    RecordInit,
    /// libvirt `reconnect`: a running container's reservation kept or re-adopted.
    Reconnect,
    /// `gpuhook attach`: more units for a running container (a reservation made if it had
    /// none).
    Attach,
    /// `gpuhook detach`: units back from a running container.
    Detach,
    /// `gpuhook release`: an operator frees a holder that no longer runs.
    Release,
    /// A stop (libvirt `stopped`/`release`, OCI `delete`/`poststop`), `reconcile`, a stale
    /// reservation reclaimed: freed whatever its phase.
    Stop,
}

/// A reservation as a step finds it: its phase, and whether its holder lives: a running
/// one's init, a prepared one's reserving process when it is another than the step's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub phase: Phase,
    pub live: bool,
}

/// Why a step may not be taken (each step says it in its own words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    /// The holder has no reservation.
    NoReservation,
    /// Its reservation is only prepared: no container runs with it yet.
    NotRunning,
    /// Its container runs (or the init a create recorded does).
    Runs,
    /// Another `create` of the same container, which lives, prepared it.
    Creating,
}

impl Transition {
    /// The transition table: the phase a reservation found as `from` (`None`: the holder has
    /// none) is in after this step (`None`: out of the state), or why the step may not be
    /// taken.
    pub fn from(self, from: Option<Found>) -> Result<Option<Phase>, Blocked> {
        use Blocked::*;
        use Phase::*;
        use Transition::*;
        let from = from.map(|f| (f.phase, f.live));
        match (self, from) {
            (Prepare, Some((Running, true))) => Err(Runs),
            (Prepare, Some((Prepared, true))) => Err(Creating),
            (Prepare, _) => Ok(Some(Prepared)),
            (Start | RecordInit | Detach | Release, None) => Err(NoReservation),
            (Start, Some(_)) => Ok(Some(Running)),
            (RecordInit, Some((Prepared, _))) => Ok(Some(Running)),
            (RecordInit, Some((Running, _))) => Err(Runs),
            (Reconnect, _) | (Attach, None) => Ok(Some(Running)),
            (Attach | Detach, Some((Prepared, _))) => Err(NotRunning),
            (Attach | Detach, Some((Running, _))) => Ok(Some(Running)),
            (Release, Some((Running, true))) => Err(Runs),
            (Release, Some(_)) | (Stop, _) => Ok(None),
        }
    }
}

/// What a reservation records of its running container, the one way into [`Phase::Running`]
/// ([`super::Reservation::set_running`]): libvirt's controller (an OCI container has none),
/// the container's init, the nodes it has, and where an OCI runtime put the init.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub controller: Option<i32>,
    pub init: ProcRef,
    pub nodes: Vec<Node>,
    pub cgroup: Option<crate::cgroup::Made>,
    pub namespaces: Option<crate::host::procfs::Namespaces>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const STEPS: [Transition; 8] = [
        Transition::Prepare,
        Transition::Start,
        Transition::RecordInit,
        Transition::Reconnect,
        Transition::Attach,
        Transition::Detach,
        Transition::Release,
        Transition::Stop,
    ];

    /// Where a step takes a reservation, or why it may not.
    type After = Result<Option<Phase>, Blocked>;

    fn found(phase: Phase, live: bool) -> Option<Found> {
        Some(Found { phase, live })
    }

    /// The whole table, row by row, as the module's documentation states it.
    #[test]
    fn the_transition_table() {
        use Blocked::*;
        use Phase::*;
        let froms = [
            None,
            found(Prepared, false),
            found(Prepared, true),
            found(Running, false),
            found(Running, true),
        ];
        let r = |p: Phase| Ok(Some(p));
        let freed = Ok(None);
        let table: [(Transition, [After; 5]); 8] = [
            (
                Transition::Prepare,
                [
                    r(Prepared),
                    r(Prepared),
                    Err(Creating),
                    r(Prepared),
                    Err(Runs),
                ],
            ),
            (
                Transition::Start,
                [
                    Err(NoReservation),
                    r(Running),
                    r(Running),
                    r(Running),
                    r(Running),
                ],
            ),
            (
                Transition::RecordInit,
                [
                    Err(NoReservation),
                    r(Running),
                    r(Running),
                    Err(Runs),
                    Err(Runs),
                ],
            ),
            (
                Transition::Reconnect,
                [r(Running), r(Running), r(Running), r(Running), r(Running)],
            ),
            (
                Transition::Attach,
                [
                    r(Running),
                    Err(NotRunning),
                    Err(NotRunning),
                    r(Running),
                    r(Running),
                ],
            ),
            (
                Transition::Detach,
                [
                    Err(NoReservation),
                    Err(NotRunning),
                    Err(NotRunning),
                    r(Running),
                    r(Running),
                ],
            ),
            (
                Transition::Release,
                [Err(NoReservation), freed, freed, freed, Err(Runs)],
            ),
            (Transition::Stop, [freed, freed, freed, freed, freed]),
        ];
        assert_eq!(table.map(|(s, _)| s), STEPS);
        for (step, row) in table {
            for (from, want) in froms.iter().zip(row) {
                assert_eq!(step.from(*from), want, "{step:?} from {from:?}");
            }
        }
    }

    /// No step ever leaves a reservation prepared but `Prepare`, and none makes one out of
    /// nothing but `Prepare`, `Reconnect` and `Attach`.
    #[test]
    fn only_some_steps_make_or_prepare() {
        for step in STEPS {
            let made = step.from(None);
            assert_eq!(
                matches!(made, Ok(Some(_))),
                matches!(
                    step,
                    Transition::Prepare | Transition::Reconnect | Transition::Attach
                ),
                "{step:?}"
            );
            for phase in [Phase::Prepared, Phase::Running] {
                for live in [false, true] {
                    if step.from(found(phase, live)) == Ok(Some(Phase::Prepared)) {
                        assert_eq!(step, Transition::Prepare);
                    }
                }
            }
        }
        assert_eq!(Phase::Prepared.as_str(), "prepared");
        assert_eq!(Phase::Running.as_str(), "running");
    }
}
