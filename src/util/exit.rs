//! What the `weir` command exits with: one table, read by `src/main.rs` and by the generated
//! reference (`weir::guide::reference::exit_codes`), so the two cannot disagree. The codes
//! follow `sysexits.h` where one fits, and the shell's 128 + signal.

/// How `weir validate` or `weir run` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The job file is good (`validate`), or the job ran to its end (`run`).
    Ok,
    /// The job failed (a subtask's error, the failure named on stderr), or it could not start
    /// for a reason that is not its configuration.
    Failed,
    /// The command line is wrong: an unknown option, a bad `--metrics` address or a port in use
    /// (before the job starts), a companion program (`weir top`, `weir demo`) not installed.
    Usage,
    /// A service the job needs is unavailable or refused it (`EX_UNAVAILABLE`): Kafka or the
    /// schema registry unreachable, credentials refused, a certificate not trusted, the
    /// instances' checkpoint store unreachable. Retrying later may work.
    Unavailable,
    /// The configuration is wrong (`EX_CONFIG`): a bad job file (with file, line, column and
    /// field), a checkpoint directory that cannot be restored from, a client setting the
    /// client refused. Retrying the same will not work.
    Config,
    /// A stop (the first SIGINT or SIGTERM) did not finish within the job's `stop_timeout_ms`
    /// (`EX_TEMPFAIL`): stderr names the subtasks still running and what each waits for; they
    /// were left behind, nothing they held was committed, and the next run replays it from the
    /// last checkpoint.
    StopTimedOut,
    /// Stopped by SIGINT (130) or SIGTERM (143): the job stopped cleanly; the next run
    /// resumes from its last checkpoint.
    Signal(u8),
}

impl Exit {
    /// Every way the command ends, in the order the reference lists them (the signals as
    /// SIGINT and SIGTERM).
    pub const ALL: [Exit; 8] = [
        Exit::Ok,
        Exit::Failed,
        Exit::Usage,
        Exit::Unavailable,
        Exit::StopTimedOut,
        Exit::Config,
        Exit::Signal(2),
        Exit::Signal(15),
    ];

    /// The process's exit status.
    pub fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Failed => 1,
            Exit::Usage => 2,
            Exit::Unavailable => 69,
            Exit::StopTimedOut => 75,
            Exit::Config => 78,
            Exit::Signal(signal) => 128u8.saturating_add(signal),
        }
    }

    /// What it means, in a line, and what to do.
    pub fn meaning(self) -> &'static str {
        match self {
            Exit::Ok => "the job file is good (validate), or the job ran to its end (run)",
            Exit::Failed => "the job failed; stderr names the subtask and its error",
            Exit::Usage => {
                "the command line is wrong: an unknown option, a bad --metrics address or a port in use, \
                 a companion program (weir top, weir demo) not installed"
            }
            Exit::Unavailable => {
                "a service the job needs is unavailable or refused it (Kafka, PostgreSQL, the schema registry, \
                 the instances' checkpoint store; credentials, certificates, privileges): retrying later may work"
            }
            Exit::Config => {
                "the configuration is wrong: a bad job file (file:line:column and field), a checkpoint \
                 directory that cannot be restored, a client setting the client refused"
            }
            Exit::StopTimedOut => {
                "a stop did not finish within `[job] stop_timeout_ms` (10 s by default): stderr names the subtasks \
                 still running and what each waits for; nothing they held was committed, the next run replays it \
                 from the last checkpoint"
            }
            Exit::Signal(2) => "stopped by SIGINT: cleanly; the next run resumes from the last checkpoint",
            Exit::Signal(15) => "stopped by SIGTERM: cleanly; the next run resumes from the last checkpoint",
            Exit::Signal(_) => "stopped by a signal",
        }
    }

    /// The reference page: a table of every code (`weir::guide::reference::exit_codes`).
    pub fn reference() -> String {
        let mut out = String::from(
            "# Exit codes\n\n\
             What `weir validate` and `weir run` exit with (generated from `weir::util::exit::Exit`, which\n\
             `weir` itself uses). A second SIGINT or SIGTERM exits at once with the same 128 + signal.\n\n\
             | code | meaning |\n|---:|---|\n",
        );
        for e in Exit::ALL {
            out.push_str(&format!("| {} | {} |\n", e.code(), e.meaning()));
        }
        out
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(e: Exit) -> std::process::ExitCode {
        std::process::ExitCode::from(e.code())
    }
}
