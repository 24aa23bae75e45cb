//! From a described graph to what runs: check it, decide each edge's partitioning, and
//! chain forward edges into subtasks.

use crate::graph::{GraphError, GraphInner, NodeKind};
use crate::record::Partitioning;
use weir_ring::{IdleStrategy, RingConfig};

/// A path of nodes that runs as one subtask per parallel instance (plain calls between them).
#[derive(Debug, Clone)]
pub(crate) struct Chain {
    /// Node indices, head first.
    pub nodes: Vec<usize>,
    pub parallelism: u32,
}

/// An edge that crosses rings.
#[derive(Debug, Clone)]
pub(crate) struct Exchange {
    /// Index into the graph's edges.
    pub edge: usize,
    pub from_chain: usize,
    pub to_chain: usize,
    pub partitioning: Partitioning,
    /// What this exchange's in-flight data may take to drain (credit by time), `None`: no
    /// announcement, its rings fill up.
    pub inflight_target: Option<std::time::Duration>,
}

/// The slot bytes an exchange's rings may hold together before they are made smaller than
/// `ring_slots` (see `Plan::ring_config`).
const EXCHANGE_RING_BYTES: u64 = 64 << 20;

/// Slots below which an exchange's rings are not made smaller: the size every ring had
/// before `DEFAULT_RING_SLOTS` grew to 4096.
const MIN_EXCHANGE_RING_SLOTS: u32 = 1024;

/// The resolved graph.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// In topological order.
    pub chains: Vec<Chain>,
    pub exchanges: Vec<Exchange>,
}

impl Plan {
    pub(crate) fn build(g: &GraphInner) -> Result<Plan, GraphError> {
        if let Some(e) = g.errors.first() {
            return Err(e.clone());
        }
        let c = &g.config;
        c.check()?;
        let n = g.nodes.len();
        if !g.nodes.iter().any(|node| matches!(node.kind, NodeKind::Source(_))) {
            return Err(GraphError::NoSource);
        }
        let mut inputs = vec![Vec::new(); n];
        let mut outputs = vec![Vec::new(); n];
        for (i, e) in g.edges.iter().enumerate() {
            outputs[e.from].push(i);
            inputs[e.to].push(i);
        }
        for (i, node) in g.nodes.iter().enumerate() {
            match node.kind {
                NodeKind::Source(_) => {}
                _ if inputs[i].is_empty() => return Err(GraphError::NoInput { node: node.id.clone() }),
                _ => {}
            }
            if !matches!(node.kind, NodeKind::Sink(_)) && outputs[i].is_empty() {
                return Err(GraphError::Dangling { node: node.id.clone() });
            }
        }
        let order = topological_order(g, &inputs, &outputs)?;

        let mut partitioning = Vec::with_capacity(g.edges.len());
        let mut unchainable = Vec::with_capacity(g.edges.len());
        for e in &g.edges {
            let (from, to) = (&g.nodes[e.from], &g.nodes[e.to]);
            let p = match e.partitioning {
                Some(p) => p,
                None if from.parallelism == to.parallelism => Partitioning::Forward,
                None => Partitioning::Rebalance,
            };
            if p == Partitioning::Forward && from.parallelism != to.parallelism {
                return Err(GraphError::ForwardParallelism {
                    from: from.id.clone(),
                    to: to.id.clone(),
                    from_parallelism: from.parallelism,
                    to_parallelism: to.parallelism,
                });
            }
            if to.keyed && p != Partitioning::Hash {
                return Err(GraphError::KeyedWithoutKeyBy { node: to.id.clone(), input: from.id.clone() });
            }
            // One instance of several: a key stays in its partition's subtask (see
            // `InstanceShare`), so key_by is forward, and so is everything else.
            // A keyed node heads its chain (its pending work and timers are driven by the
            // subtask loop only there), so a key_by made forward still is no chained edge.
            unchainable.push(p == Partitioning::Hash);
            let p = match (&c.instance, p) {
                (None, p) => p,
                (Some(_), Partitioning::Broadcast) => {
                    return Err(GraphError::Setting {
                        field: "instance",
                        problem: format!(
                            "the edge {} -> {} broadcasts, and an instance holds only its own partitions; run this job as one instance",
                            from.id, to.id
                        ),
                    });
                }
                (Some(_), _) => Partitioning::Forward,
            };
            if p == Partitioning::Hash && to.parallelism > c.max_key_groups {
                return Err(GraphError::KeyGroups {
                    node: to.id.clone(),
                    parallelism: to.parallelism,
                    max_key_groups: c.max_key_groups,
                });
            }
            partitioning.push(p);
        }

        // Chain: an edge is chained when it is forward, its sender has no other output and its
        // receiver no other input. Each node then has at most one chained edge in and out, so
        // chains are paths; walking in topological order builds them head first.
        let chained = |e: usize| {
            let edge = &g.edges[e];
            c.chaining
                && partitioning[e] == Partitioning::Forward
                && !unchainable[e]
                && outputs[edge.from].len() == 1
                && inputs[edge.to].len() == 1
        };
        let mut chain_of = vec![usize::MAX; n];
        let mut chains: Vec<Chain> = Vec::new();
        for &node in &order {
            match inputs[node].as_slice() {
                [e] if chained(*e) => {
                    let ci = chain_of[g.edges[*e].from];
                    chains[ci].nodes.push(node);
                    chain_of[node] = ci;
                }
                _ => {
                    chain_of[node] = chains.len();
                    chains.push(Chain { nodes: vec![node], parallelism: g.nodes[node].parallelism });
                }
            }
        }
        let exchanges = (0..g.edges.len())
            .filter(|&e| chain_of[g.edges[e].from] != chain_of[g.edges[e].to])
            .map(|e| Exchange {
                edge: e,
                from_chain: chain_of[g.edges[e].from],
                to_chain: chain_of[g.edges[e].to],
                partitioning: partitioning[e],
                inflight_target: None,
            })
            .collect();
        let mut plan = Plan { chains, exchanges };
        plan.set_inflight_targets(g)?;
        plan.check_size(g)?;
        Ok(plan)
    }

    /// Each exchange's in-flight target: the node's own if it has one, else the job's
    /// divided by the number of rings on the longest source-to-sink path through it, so a
    /// barrier crossing that path waits behind at most the job's target in all.
    fn set_inflight_targets(&mut self, g: &GraphInner) -> Result<(), GraphError> {
        if let Some(id) = g.config.node_inflight_targets.keys().find(|id| !g.ids.contains(id.as_str())) {
            return Err(GraphError::Setting {
                field: "inflight_target",
                problem: format!("node `{id}` has an in-flight target but no such node is in the job"),
            });
        }
        let n = self.chains.len();
        let (mut up, mut down) = (vec![0u32; n], vec![0u32; n]);
        let mut into: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut out_of: Vec<Vec<usize>> = vec![Vec::new(); n];
        for x in &self.exchanges {
            into[x.to_chain].push(x.from_chain);
            out_of[x.from_chain].push(x.to_chain);
        }
        // Chains are in topological order: rings into a chain come from chains before it.
        for c in 0..n {
            up[c] = into[c].iter().map(|&f| up[f] + 1).max().unwrap_or(0);
        }
        for c in (0..n).rev() {
            down[c] = out_of[c].iter().map(|&t| down[t] + 1).max().unwrap_or(0);
        }
        for x in &mut self.exchanges {
            let to = &g.nodes[g.edges[x.edge].to].id;
            x.inflight_target = match g.config.node_inflight_targets.get(to) {
                Some(own) => *own,
                None => g.config.inflight_target.map(|t| t / (up[x.from_chain] + 1 + down[x.to_chain])),
            };
        }
        Ok(())
    }

    /// The rings of exchange `x`: `ring_slots` slots each, unless the exchange's rings
    /// together would hold more than `EXCHANGE_RING_BYTES`: then halved until they fit, but
    /// not below `MIN_EXCHANGE_RING_SLOTS` (or `ring_slots`, if smaller) nor below what the
    /// largest record needs. An all-to-all exchange has parallelism² rings; this keeps its
    /// memory where 1024-slot rings had it at high parallelism (at p = 64, 4,096 rings of
    /// 64 KiB rather than 1 GiB), and its rings whole where there are few (sharing the slots
    /// among senders at p = 2 cost key_by 8 % per CPU-second: `--example keyed 20000000 2`,
    /// 44.9–46.0 → 39.7–42.4 M, alternated).
    pub(crate) fn ring_config(&self, x: &Exchange, c: &crate::graph::JobConfig) -> RingConfig {
        let mut ring =
            RingConfig { slot_bytes: c.slot_bytes, slot_count: c.ring_slots, max_record_bytes: c.max_record_bytes };
        let count = self.ring_count(x);
        let floor = MIN_EXCHANGE_RING_SLOTS.min(c.ring_slots);
        while ring.slot_count > floor && count.saturating_mul(ring.ring_bytes()) > EXCHANGE_RING_BYTES {
            let half = RingConfig { slot_count: ring.slot_count / 2, ..ring };
            if half.validate().is_err() {
                break;
            }
            ring = half;
        }
        ring
    }

    /// The rings of exchange `x`: one per sender on a forward edge, one per (sender,
    /// receiver) pair otherwise.
    fn ring_count(&self, x: &Exchange) -> u64 {
        let (a, b) = (self.chains[x.from_chain].parallelism as u64, self.chains[x.to_chain].parallelism as u64);
        if x.partitioning == Partitioning::Forward { a } else { a.saturating_mul(b) }
    }

    /// What the machine cannot hold: more threads than a node may have, or rings whose
    /// memory alone is more than half of the machine's.
    fn check_size(&self, g: &GraphInner) -> Result<(), GraphError> {
        if let Some(node) = g.nodes.iter().find(|n| n.parallelism > MAX_PARALLELISM) {
            return Err(GraphError::TooParallel {
                node: node.id.clone(),
                parallelism: node.parallelism,
                max: MAX_PARALLELISM,
            });
        }
        if let Some(chain) = self.chains.iter().find(|c| c.nodes.len() > MAX_CHAINED) {
            return Err(GraphError::Setting {
                field: "chaining",
                problem: format!(
                    "`{}` heads a chain of {} operators; at most {MAX_CHAINED} run chained in one subtask (each \
                     is a call deeper on its thread's stack): put a rebalance between them, or chaining = false",
                    g.nodes[chain.nodes[0]].id,
                    chain.nodes.len()
                ),
            });
        }
        let c = &g.config;
        if c.idle == IdleStrategy::BusySpin {
            let subtasks: u32 = self.chains.iter().map(|c| c.parallelism).sum();
            let cpus = host_cpus(c.pinning);
            if cpus > 0 && subtasks as usize > cpus {
                return Err(GraphError::Setting {
                    field: "idle",
                    problem: format!(
                        "busy-spin (the latency profile) keeps every subtask spinning on a CPU of its own, but this \
                         job has {subtasks} subtasks and {cpus} CPUs to run them on: a spinner would take the CPU \
                         from the very subtasks it waits for; use idle = \"park\" (the default), or fewer \
                         subtasks (lower the parallelism, or chain more)"
                    ),
                });
            }
        }
        if c.fibers && !c.pinning {
            return Err(GraphError::Setting {
                field: "fibers",
                problem: "fibers share one thread among the subtasks pinned to a CPU, but pinning is off: turn \
                          pinning on, or fibers off"
                    .into(),
            });
        }
        if c.fibers && c.idle == IdleStrategy::BusySpin {
            return Err(GraphError::Setting {
                field: "fibers",
                problem: "a busy-spinning fiber never hands its thread to the other fibers on its CPU: use \
                          idle = \"park\" (the default) with fibers, or fibers off with busy-spin"
                    .into(),
            });
        }
        let (mut rings, mut bytes) = (0u64, 0u64);
        for x in &self.exchanges {
            let count = self.ring_count(x);
            rings = rings.saturating_add(count);
            bytes = bytes.saturating_add(count.saturating_mul(self.ring_config(x, c).region_bytes()));
        }
        if let Some(machine) = crate::telemetry::physical_memory_bytes()
            && bytes > machine / 2
        {
            return Err(GraphError::Setting {
                field: "ring",
                problem: format!(
                    "{rings} rings need {}, more than half of this machine's {}; lower ring_slots or slot_bytes, or the parallelism",
                    crate::telemetry::bytes(bytes),
                    crate::telemetry::bytes(machine)
                ),
            });
        }
        Ok(())
    }
}

/// The most operators one chain may hold (a record goes through them as nested calls).
pub const MAX_CHAINED: usize = 1024;

/// The most subtasks one node may have.
pub const MAX_PARALLELISM: u32 = 4096;

/// Kahn's algorithm; a leftover node is on a cycle.
fn topological_order(g: &GraphInner, inputs: &[Vec<usize>], outputs: &[Vec<usize>]) -> Result<Vec<usize>, GraphError> {
    let n = g.nodes.len();
    let mut indegree: Vec<usize> = inputs.iter().map(Vec::len).collect();
    let mut ready: Vec<usize> = (0..n).filter(|&i| indegree[i] == 0).collect();
    ready.reverse();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop() {
        order.push(i);
        for &e in &outputs[i] {
            let to = g.edges[e].to;
            indegree[to] -= 1;
            if indegree[to] == 0 {
                ready.push(to);
            }
        }
    }
    if order.len() < n {
        let nodes: Vec<&str> = (0..n).filter(|&i| indegree[i] > 0).map(|i| g.nodes[i].id.as_str()).collect();
        return Err(GraphError::Cycle { nodes: nodes.join(" -> ") });
    }
    Ok(order)
}

impl Plan {
    /// The plan for people: chains (what runs in one thread) and exchanges (what crosses rings).
    pub(crate) fn describe(&self, g: &GraphInner) -> String {
        let mut out = String::new();
        for (i, chain) in self.chains.iter().enumerate() {
            let ids: Vec<String> =
                chain.nodes.iter().map(|&n| format!("{} ({})", g.nodes[n].id, g.nodes[n].op)).collect();
            out += &format!("chain {i}: {} x{}\n", ids.join(" -> "), chain.parallelism);
        }
        for x in &self.exchanges {
            let e = &g.edges[x.edge];
            let how = match (&e.key_by, x.partitioning) {
                (Some(k), Partitioning::Hash) => format!("hash by `{k}`"),
                (_, p) => p.name().to_owned(),
            };
            let (a, b) = (self.chains[x.from_chain].parallelism, self.chains[x.to_chain].parallelism);
            let rings = if x.partitioning == Partitioning::Forward { a } else { a * b };
            let rings = if rings == 1 { "1 ring".to_owned() } else { format!("{rings} rings") };
            out += &format!("exchange: {} -> {} ({how}, {rings})\n", g.nodes[e.from].id, g.nodes[e.to].id);
        }
        out
    }
}

impl crate::graph::Job {
    /// Check the graph and resolve it for the runtime (also done by `start`).
    pub fn validate(&self) -> Result<(), GraphError> {
        Plan::build(&self.inner.borrow()).map(|_| ())
    }

    /// Validate and describe how the job will run: its chains and exchanges.
    pub fn describe(&self) -> Result<String, GraphError> {
        let g = self.inner.borrow();
        Ok(Plan::build(&g)?.describe(&g))
    }
}

/// The CPUs subtasks run on: those pinning can use (0 if the list is unreadable), or
/// what the process may use unpinned.
pub(super) fn host_cpus(pinning: bool) -> usize {
    if pinning {
        core_affinity::get_core_ids().map_or(0, |ids| ids.len())
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::JobConfig;

    /// A plan of two chains of parallelism `a` and `b` joined by one exchange.
    fn plan(a: u32, b: u32, partitioning: Partitioning) -> (Plan, Exchange) {
        let x = Exchange { edge: 0, from_chain: 0, to_chain: 1, partitioning, inflight_target: None };
        let chains = vec![Chain { nodes: vec![0], parallelism: a }, Chain { nodes: vec![1], parallelism: b }];
        (Plan { chains, exchanges: vec![x.clone()] }, x)
    }

    /// An exchange's rings keep `ring_slots` while together they hold at most 64 MiB, and
    /// are halved beyond, down to 1024 slots (or `ring_slots`, if smaller), and never below
    /// what the largest record needs.
    #[test]
    fn an_exchange_of_many_rings_gets_smaller_rings() {
        let slots = |a, b, p, f: &dyn Fn(&mut JobConfig)| {
            let mut c = JobConfig::new("t");
            f(&mut c);
            let (plan, x) = plan(a, b, p);
            let ring = plan.ring_config(&x, &c);
            assert!(ring.validate().is_ok(), "{ring:?}");
            ring.slot_count
        };
        let default = |_: &mut JobConfig| {};
        assert_eq!(slots(64, 64, Partitioning::Forward, &default), crate::graph::DEFAULT_RING_SLOTS);
        assert_eq!(slots(2, 2, Partitioning::Hash, &default), 4096);
        assert_eq!(slots(16, 16, Partitioning::Hash, &default), 4096, "256 rings of 256 KiB: 64 MiB");
        assert_eq!(slots(32, 32, Partitioning::Rebalance, &default), 1024, "1024 rings of 64 KiB");
        assert_eq!(slots(64, 64, Partitioning::Hash, &default), 1024, "never below 1024");
        let small = |c: &mut JobConfig| {
            c.ring_slots = 256;
            c.max_record_bytes = 1024;
        };
        assert_eq!(slots(512, 512, Partitioning::Broadcast, &small), 256, "nor above ring_slots");
        // 64-byte slots and records up to 200 KiB: a ring of 4096 slots (256 KiB) holds one,
        // one of 2048 would not, so the exchange keeps 4096.
        assert_eq!(slots(64, 64, Partitioning::Hash, &|c| c.max_record_bytes = 200 * 1024), 4096);
    }
}
