//! Where a sandbox is in its life, and which operation is legal in which phase: one table
//! every operation asks before acting.
//!
//! | phase \ action | pause | resume | kill | use (exec, files, processes) | commit | init exited |
//! |---|---|---|---|---|---|---|
//! | running  | proceed | no-op | proceed | proceed | proceed | proceed |
//! | paused   | no-op | proceed | proceed | resume first | proceed | proceed |
//! | stopping | gone | gone | not found | gone | gone | no-op |
//!
//! "Resume first" is transparent resume: any operation that talks to the guest thaws a paused
//! sandbox before it starts. "Gone" (410-like, the sandbox is being torn down) and "not found"
//! are the API's answers.

/// Where a sandbox is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Running and answering.
    Running,
    /// Frozen.
    Paused,
    /// Being torn down; no operation may start.
    Stopping,
}

/// An operation on a sandbox, as the table knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Freeze it (a pause, a task pause, an idle pause).
    Pause,
    /// Thaw it (a resume, a task resume).
    Resume,
    /// Kill it (a kill, a task stop, a timeout, an idle stop).
    Kill,
    /// Talk to its guest (exec, files, processes, trajectory replay).
    Use,
    /// Copy its writable layer into an image layer.
    Commit,
    /// Its init exited on its own.
    InitExited,
}

/// What an operation does in a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Go ahead.
    Proceed,
    /// It is already so: answer as if done.
    NoOp,
    /// Resume it, then go ahead.
    ResumeFirst,
    /// It is being torn down.
    Gone,
    /// It is not there (any more).
    NotFound,
}

/// The table.
pub fn verdict(phase: Phase, action: Action) -> Verdict {
    use Action as A;
    use Phase as P;
    use Verdict as V;
    match (phase, action) {
        (P::Running, A::Resume) => V::NoOp,
        (P::Running, _) => V::Proceed,
        (P::Paused, A::Pause) => V::NoOp,
        (P::Paused, A::Use) => V::ResumeFirst,
        (P::Paused, _) => V::Proceed,
        (P::Stopping, A::Kill) => V::NotFound,
        (P::Stopping, A::InitExited) => V::NoOp,
        (P::Stopping, _) => V::Gone,
    }
}

/// The phase an action that proceeds leaves the sandbox in (`None`: unchanged).
pub fn after(action: Action) -> Option<Phase> {
    match action {
        Action::Pause => Some(Phase::Paused),
        Action::Resume => Some(Phase::Running),
        Action::Kill | Action::InitExited => Some(Phase::Stopping),
        Action::Use | Action::Commit => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PHASES: [Phase; 3] = [Phase::Running, Phase::Paused, Phase::Stopping];
    const ACTIONS: [Action; 6] = [
        Action::Pause,
        Action::Resume,
        Action::Kill,
        Action::Use,
        Action::Commit,
        Action::InitExited,
    ];

    #[test]
    fn the_table_is_the_documented_one() {
        use Verdict::*;
        // Rows: running, paused, stopping; columns as ACTIONS.
        let want = [
            [Proceed, NoOp, Proceed, Proceed, Proceed, Proceed],
            [NoOp, Proceed, Proceed, ResumeFirst, Proceed, Proceed],
            [Gone, Gone, NotFound, Gone, Gone, NoOp],
        ];
        for (p, row) in PHASES.iter().zip(want) {
            for (a, v) in ACTIONS.iter().zip(row) {
                assert_eq!(verdict(*p, *a), v, "{p:?} × {a:?}");
            }
        }
    }

    #[test]
    fn nothing_leaves_stopping_and_every_proceeding_action_lands_somewhere_legal() {
        for a in ACTIONS {
            assert_ne!(verdict(Phase::Stopping, a), Verdict::Proceed, "{a:?}");
            for p in PHASES {
                if verdict(p, a) == Verdict::Proceed
                    && let Some(next) = after(a)
                {
                    // A sandbox that proceeded can always be killed afterwards.
                    assert!(
                        next == Phase::Stopping || verdict(next, Action::Kill) == Verdict::Proceed
                    );
                }
            }
        }
    }
}
