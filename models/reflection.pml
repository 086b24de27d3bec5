/*
 * The reflection protocol, modelled for spin: the lock, the launch, the
 * child's commits, the finalize/merge under the memory lease, a supervisor
 * crash at any point and the recovery of the next supervisor. One agent,
 * one reflection at a time, the main agent committing concurrently.
 *
 * Which code each step stands for:
 *   lock_owner             reflection.lock — reflection::lock::try_acquire_labeled
 *                          (acquire; a dead owner is reclaimed), lock::release
 *   alive[]                lock::process_start_time (a dead or zombie owner is stale)
 *   lease                  supervisor::leases (one memory writer per agent; in the
 *                          supervisor's memory, so it goes with a crashed supervisor)
 *   agent()                a turn's memory tool: lease, commit (rpc::memory_commit), ack
 *   launch                 supervisor::reflect::prepare + launch_reflection
 *                          (worktree::create makes the branch)
 *   child()                the reflection child's commits on its branch (rpc::memory_commit
 *                          routed to the worktree), or its death (kill -9)
 *   finalize               supervisor::reflect::finalize_reflection ->
 *                          memfs::worktree::finalize_reflection (merge_into_main under
 *                          RepoLock, branch deleted), payload::finalize_success (cursor)
 *   crash / recover        kill -9 of the supervisor; reflect::recover at the next start
 *                          (worktree::cleanup_orphans, stale lock reclaimed)
 *
 * Checked (scripts/check-model): no acknowledged main commit is lost, two
 * launches never share the worktree slot (the lock), at most one merge per
 * launch, no deadlock, and at the end the lock is free or held by a dead
 * owner (reclaimable) with no branch left behind by a finished supervisor.
 */

#define NONE 0
#define MAXC 2   /* commits the main agent makes */

byte lock_owner = NONE;     /* 0: free, else the supervisor incarnation */
bool alive[3];              /* incarnations 1 and 2 */
byte lease = NONE;          /* 0: free; 1, 2: a supervisor (finalize); 9: the main agent */
byte main_acked = 0;        /* main-agent commits acknowledged */
byte main_commits = 0;      /* main-agent commits reachable on main */
bool branch_exists = 0;
byte branch_commits = 0;
byte merges = 0;            /* reflection merges into main (one per branch at most) */
bool cursor_advanced = 0;
bool child_running = 0;
bool child_ok = 0;
bool crashed = 0;
bool done1 = 0;
byte launchers_done[3];   /* per supervisor incarnation */
bool done2 = 0;

proctype agent() {
    byte n = 0;
    do
    :: n < MAXC ->
        atomic { lease == NONE -> lease = 9 };
        main_commits++;          /* the commit lands on main ... */
        main_acked++;            /* ... then the tool is told */
        lease = NONE;
        n++
    :: n == MAXC -> break
    od
}

proctype child() {
    /* Commits on its branch, then exits; or dies at any point (kill -9,
     * or with its supervisor). */
    do
    :: crashed -> child_running = 0; break
    :: !crashed && branch_commits < 2 -> branch_commits++
    :: !crashed -> child_ok = 1; child_running = 0; break
    :: !crashed -> child_ok = 0; child_running = 0; break   /* failed / killed */
    od
}

/* One launch of a reflection by supervisor `me`: two of these run at
 * once in the first supervisor (an automatic trigger and a manual
 * `reflect`), so the lock is what keeps their worktrees apart. */
inline launch(me) {
        if
        :: atomic { lock_owner == NONE -> lock_owner = me };
            assert(!branch_exists);  /* one reflection's worktree at a time */
            branch_exists = 1;
            branch_commits = 0;
            child_ok = 0;
            child_running = 1;
            run child();
            (child_running == 0);
            /* finalize under the memory lease (the repository lock is
             * inside; it is never held without the lease here) */
            atomic { lease == NONE -> lease = me };
            if
            :: child_ok && branch_commits > 0 ->
                assert(branch_exists);
                merges++;            /* one merge commit on main */
                cursor_advanced = 1
            :: child_ok && branch_commits == 0 ->
                cursor_advanced = 1  /* no_changes consumes the transcript */
            :: !child_ok -> skip     /* failed: the transcript is retried */
            fi;
            branch_exists = 0;       /* -d after a merge, -D otherwise */
            lease = NONE;
            lock_owner = NONE        /* RELEASE */
        :: atomic { lock_owner != NONE -> skip }   /* already_active */
        fi
}

proctype launcher(byte me) {
    launch(me) unless { crashed && me == 1 };
    launchers_done[me]++
}

proctype supervisor(byte me) {
    {
        /* recover: what a dead predecessor left */
        atomic {
            if
            :: lock_owner != NONE && !alive[lock_owner] ->
                branch_exists = 0;       /* cleanup_orphans */
                lock_owner = NONE        /* stale lock reclaimed */
            :: else -> skip
            fi
        };
        /* launches: an automatic and a manual one at once */
        if
        :: me == 1 -> run launcher(me); run launcher(me); (launchers_done[me] == 2)
        :: me == 2 -> run launcher(me); (launchers_done[me] == 1)
        fi
    } unless { crashed && me == 1 };
    /* a crashed supervisor's in-memory lease goes with it */
    atomic {
        if
        :: lease == me -> lease = NONE
        :: else -> skip
        fi;
        if
        :: me == 1 -> done1 = 1
        :: else -> done2 = 1
        fi
    }
}

proctype crasher() {
    if
    :: skip                                     /* no crash this run */
    :: atomic { crashed = 1; alive[1] = 0 }     /* kill -9 of supervisor 1 */
    fi
}

init {
    alive[1] = 1;
    alive[2] = 0;
    atomic {
        run agent();
        run supervisor(1);
        run crasher()
    };
    done1;
    /* the next start after a crash (a new incarnation) */
    if
    :: crashed -> alive[2] = 1; run supervisor(2); done2
    :: else -> skip
    fi;
    (child_running == 0);
    /* the end: nothing lost, nothing merged twice, nothing held */
    assert(merges <= 2);
    assert(lock_owner == NONE || !alive[lock_owner]);
    assert(!branch_exists || (lock_owner != NONE && !alive[lock_owner]))
}

/* No acknowledged commit ever missing from main. */
ltl no_lost_commit { [] (main_commits >= main_acked) }
/* A branch is merged at most once. */
ltl no_double_merge { [] (merges <= 2) }
