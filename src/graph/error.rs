//! What can be wrong with a job graph; each message names the node and what to change.

/// A graph the runtime cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    /// Parallelism 0.
    #[error("node `{node}`: parallelism 0; give it at least 1 subtask")]
    Parallelism {
        /// The node.
        node: String,
    },
    /// More subtasks than one node may have (each is a thread).
    #[error("node `{node}`: parallelism {parallelism}; at most {max} subtasks per node (each is a thread)")]
    TooParallel {
        /// The node.
        node: String,
        /// Its parallelism.
        parallelism: u32,
        /// The bound.
        max: u32,
    },
    /// Two nodes share an id.
    #[error("node id `{node}` is used twice; ids must be unique (they name threads, counters and checkpoint state)")]
    DuplicateId {
        /// The id.
        node: String,
    },
    /// An id with characters we don't allow.
    #[error("node id `{node}`: use 1 to 40 characters of letters, digits, `_`, `-` or `.`")]
    BadId {
        /// The id.
        node: String,
    },
    /// A forward edge between nodes of different parallelism.
    #[error(
        "edge `{from}` -> `{to}` is forward, but `{from}` has parallelism {from_parallelism} and `{to}` {to_parallelism}; make them equal, or use rebalance / key_by"
    )]
    ForwardParallelism {
        /// Sender.
        from: String,
        /// Receiver.
        to: String,
        /// Sender's parallelism.
        from_parallelism: u32,
        /// Receiver's parallelism.
        to_parallelism: u32,
    },
    /// A keyed operator whose input is not hash-partitioned.
    #[error("node `{node}` is keyed, but its input `{input}` is not partitioned by key; put a key_by between them")]
    KeyedWithoutKeyBy {
        /// The keyed node.
        node: String,
        /// Its input.
        input: String,
    },
    /// More subtasks of a keyed node than key groups.
    #[error(
        "node `{node}`: parallelism {parallelism} exceeds max_key_groups {max_key_groups}; lower it, or raise max_key_groups"
    )]
    KeyGroups {
        /// The node.
        node: String,
        /// Its parallelism.
        parallelism: u32,
        /// The job's key groups.
        max_key_groups: u32,
    },
    /// The graph has a cycle.
    #[error("the graph has a cycle through {nodes}; weir runs directed acyclic graphs: remove an edge of the cycle")]
    Cycle {
        /// The nodes on the cycle, joined by " -> ".
        nodes: String,
    },
    /// An input that names no node.
    #[error("node `{node}`: input `{input}` is not a node of this job; check the spelling, or define `{input}`")]
    UnknownInput {
        /// The node.
        node: String,
        /// The unknown input.
        input: String,
    },
    /// A node without input that is not a source.
    #[error("node `{node}` has no input; give it `input = \"...\"`, or make it a source")]
    NoInput {
        /// The node.
        node: String,
    },
    /// An operator whose output goes nowhere.
    #[error("the output of node `{node}` goes nowhere; feed it into a sink (or remove the node)")]
    Dangling {
        /// The node.
        node: String,
    },
    /// No source at all.
    #[error("the job has no source; add one")]
    NoSource,
    /// A join the runtime cannot run.
    #[error("join `{node}`: {problem}")]
    Join {
        /// The join's node id.
        node: String,
        /// What is wrong and what to do.
        problem: String,
    },
    /// A window specification the runtime cannot run.
    #[error("window `{node}`: {problem}")]
    Window {
        /// The window node.
        node: String,
        /// What is wrong and what to do.
        problem: String,
    },
    /// A bad job-level setting.
    #[error("job setting `{field}`: {problem}")]
    Setting {
        /// The setting.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
}
