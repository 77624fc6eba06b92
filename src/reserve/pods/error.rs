//! Why kubelet's `Allocate` (or the plugin's other work on the pool) is refused: one line
//! each, naming the resource, the device and who holds it.

use crate::ids::Unit;

#[derive(Debug, thiserror::Error)]
pub enum PodError {
    #[error("{resource}: no device '{id}' on this node")]
    UnknownDevice { resource: String, id: String },
    #[error("{resource}: device {id} asked for twice")]
    Twice { resource: String, id: String },
    #[error(
        "{resource}: devices {} are slots of one GPU: a container gets one slot of a GPU",
        Unit::join(units, ",")
    )]
    TwoSlots { resource: String, units: Vec<Unit> },
    /// Held by a holder other than a pod's allocation: taken since kubelet last heard the
    /// unit was free.
    #[error("{resource}: device {id} was taken by {holder} since the last ListAndWatch; nothing allocated")]
    Taken {
        resource: String,
        id: String,
        holder: String,
    },
    /// Held by another pod's allocation whose container still runs (kubelet gives a unit to
    /// a new pod only once the old one is gone: its container must be gone too).
    #[error("{resource}: device {id} is held by {holder}, whose container {container} still runs; nothing allocated")]
    InUse {
        resource: String,
        id: String,
        holder: String,
        container: String,
    },
    #[error("{resource}: device {id} cannot be given: {why}; nothing allocated")]
    Unusable {
        resource: String,
        id: String,
        why: String,
    },
    #[error("{resource}: device {id} is no longer on the host; nothing allocated")]
    Gone { resource: String, id: String },
    #[error("cannot make an allocation ID: {0}")]
    Random(#[source] std::io::Error),
    #[error(transparent)]
    Pool(#[from] Box<crate::reserve::error::Error>),
}

impl From<crate::reserve::state::StateError> for PodError {
    fn from(e: crate::reserve::state::StateError) -> PodError {
        PodError::Pool(Box::new(e.into()))
    }
}

impl From<crate::reserve::error::Error> for PodError {
    fn from(e: crate::reserve::error::Error) -> PodError {
        PodError::Pool(Box::new(e))
    }
}
