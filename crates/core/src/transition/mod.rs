//! Transitions: from the current plan `S` to a target plan `S*` as one global DAG of EMU
//! primitives — built, checked for memory at every step, ordered and costed. Pure: no MPI.
//!
//! 1. **Local DAGs** ([`local`]): per model-stage, Split → Destroy → Extend → Merge through
//!    `T_sub = (gcd(tp, tp*), gcd(pp, pp*))`, the largest layout into which both the current
//!    and the target units split. Sub-units already where a target needs them are kept; the
//!    others are destroyed, and missing ones are extended from a live replica (a unit with no
//!    other replica is destroyed only after an Extend copied it).
//! 2. **Global DAG** ([`global`]): the union, scheduled in one order by list scheduling with
//!    release-before-acquire: an acquisition (Split, Extend, Merge) that would overrun a rank's
//!    memory, or land on a rank another model-stage of the same stage still holds, waits for a
//!    Destroy that frees it; the Destroy → acquisition resource edge is recorded. Ties break
//!    in stage order generation → inference → training. If nothing can proceed, the target plan
//!    is rejected before any state moves, naming the blocked primitive and ranks.
//! 3. **Cost**: the critical path of the schedule (DAG edges plus each rank's own sequence),
//!    from bytes per link and communicator setup, with a per-node breakdown.
//! 4. **Weight sync** ([`TransitionDag::weight_sync`]): the copy of trained parameters into
//!    the layout that generates or infers is a transition too, of Sync primitives that keep
//!    every unit where it is; scheduled, checked and costed the same way.

pub mod global;
pub mod local;
pub mod target;
pub mod testing;

pub use global::{Coordination, NodeTiming, Schedule, TransitionDag, TransitionError};
pub use local::{Primitive, Unit, UnitId};
pub use target::{cheaper_targets, choose, toward, weight_syncs, TargetChoice};
