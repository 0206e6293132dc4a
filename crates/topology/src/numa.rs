//! NUMA nodes and the CPU -> node map.

use std::path::Path;
use std::sync::OnceLock;

use crate::cpulist::{online_cpus, parse_cpu_list};

/// Directory holding one `node<N>` subdirectory per NUMA node.
pub const SYSFS_NODE_DIR: &str = "/sys/devices/system/node";

/// Marks a CPU id that belongs to no node in the lookup tables.
const NO_NODE: usize = usize::MAX;

/// One NUMA node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The kernel's node id (the `N` of `/sys/devices/system/node/nodeN`).
    /// Ids may be sparse; the node's *index* is its position in
    /// [`Topology::nodes`].
    pub id: usize,
    /// Online CPUs of this node, sorted. Empty for memory-only nodes
    /// (e.g. CXL or HBM expanders).
    pub cpus: Vec<usize>,
}

/// CPUs and NUMA nodes of the machine (or a synthetic layout for tests).
///
/// Nodes are sorted by id, and "node index" below always means the position
/// in [`Topology::nodes`], which is what per-node arrays should be indexed
/// by. Every CPU of the topology is in exactly one node. The CPU -> node
/// table is built at construction: mutating the public `nodes` afterwards
/// does not update it.
#[derive(Debug, Clone)]
pub struct Topology {
    /// NUMA nodes, sorted by id.
    pub nodes: Vec<Node>,
    /// Indexed by CPU id; node index, or `NO_NODE`.
    cpu_to_node: Vec<usize>,
    /// Indexed by node id; node index, or `NO_NODE`.
    node_index_by_id: Vec<usize>,
    /// All CPUs of all nodes, sorted.
    cpus: Vec<usize>,
}

impl Topology {
    /// Reads the machine's topology from sysfs (uncached; see [`topology()`]).
    ///
    /// Node CPU lists come from `/sys/devices/system/node/node*/cpulist` and
    /// are intersected with [`online_cpus()`]. Without NUMA support (no node
    /// directories) the result is one node 0 holding every online CPU. An
    /// online CPU that no node claims is put in the first node, so per-CPU
    /// lookups never fail.
    pub fn detect() -> Topology {
        Self::from_sysfs(Path::new(SYSFS_NODE_DIR), &online_cpus())
    }

    /// Builds a topology from a sysfs-like node directory and an online-CPU
    /// list; split out of [`Topology::detect`] so tests can feed a fake tree.
    pub(crate) fn from_sysfs(node_dir: &Path, online: &[usize]) -> Topology {
        let mut nodes = Vec::new();
        if let Ok(entries) = std::fs::read_dir(node_dir) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(id) = name
                    .to_str()
                    .and_then(|n| n.strip_prefix("node"))
                    .filter(|digits| {
                        !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
                    })
                    .and_then(|digits| digits.parse::<usize>().ok())
                else {
                    continue;
                };
                // A CPU-less node has an empty (newline-only) cpulist; an
                // unreadable or garbled one is treated the same way, and its
                // CPUs (if any are online) end up in the first node.
                let cpus = std::fs::read_to_string(entry.path().join("cpulist"))
                    .ok()
                    .filter(|s| !s.trim().is_empty())
                    .and_then(|s| parse_cpu_list(&s).ok())
                    .unwrap_or_default();
                nodes.push(Node { id, cpus });
            }
        }
        Self::assemble(nodes, online)
    }

    /// A topology with the given layout: node `i` has id `i` and the CPUs
    /// `nodes[i]` (any order). Empty inner lists make memory-only nodes.
    ///
    /// # Panics
    /// If `nodes` is empty or a CPU appears in more than one node.
    pub fn synthetic(nodes: Vec<Vec<usize>>) -> Topology {
        assert!(!nodes.is_empty(), "a topology needs at least one node");
        let mut online: Vec<usize> = nodes.iter().flatten().copied().collect();
        online.sort_unstable();
        let total = online.len();
        online.dedup();
        assert_eq!(
            total,
            online.len(),
            "synthetic topology lists a CPU in more than one node (or twice in one)"
        );
        let nodes = nodes
            .into_iter()
            .enumerate()
            .map(|(id, cpus)| Node { id, cpus })
            .collect();
        Self::assemble(nodes, &online)
    }

    /// Normalises nodes (sorted by id, CPUs sorted, restricted to `online`,
    /// each CPU in exactly one node) and builds the lookup tables.
    fn assemble(mut nodes: Vec<Node>, online: &[usize]) -> Topology {
        nodes.sort_by_key(|n| n.id);
        nodes.dedup_by_key(|n| n.id);
        if nodes.is_empty() {
            nodes.push(Node {
                id: 0,
                cpus: Vec::new(),
            });
        }

        let table_len = |ids: &mut dyn Iterator<Item = usize>| ids.max().map_or(0, |m| m + 1);
        let cpu_table_len = table_len(
            &mut online
                .iter()
                .copied()
                .chain(nodes.iter().flat_map(|n| n.cpus.iter().copied())),
        );
        let mut is_online = vec![false; cpu_table_len];
        for &cpu in online {
            is_online[cpu] = true;
        }

        let mut cpu_to_node = vec![NO_NODE; cpu_table_len];
        for (index, node) in nodes.iter_mut().enumerate() {
            node.cpus.sort_unstable();
            node.cpus.dedup();
            // First node to claim a CPU keeps it.
            node.cpus
                .retain(|&cpu| is_online[cpu] && cpu_to_node[cpu] == NO_NODE);
            for &cpu in &node.cpus {
                cpu_to_node[cpu] = index;
            }
        }
        let orphans: Vec<usize> = online
            .iter()
            .copied()
            .filter(|&cpu| cpu_to_node[cpu] == NO_NODE)
            .collect();
        if !orphans.is_empty() {
            for &cpu in &orphans {
                cpu_to_node[cpu] = 0;
            }
            nodes[0].cpus.extend(orphans);
            nodes[0].cpus.sort_unstable();
        }

        let mut cpus: Vec<usize> = nodes.iter().flat_map(|n| n.cpus.iter().copied()).collect();
        cpus.sort_unstable();
        cpu_to_node.truncate(cpus.last().map_or(0, |&m| m + 1));

        let mut node_index_by_id = vec![NO_NODE; table_len(&mut nodes.iter().map(|n| n.id))];
        for (index, node) in nodes.iter().enumerate() {
            node_index_by_id[node.id] = index;
        }

        Topology {
            nodes,
            cpu_to_node,
            node_index_by_id,
            cpus,
        }
    }

    /// The NUMA nodes, sorted by id (at least one).
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// All CPUs of the topology, sorted.
    pub fn cpus(&self) -> &[usize] {
        &self.cpus
    }

    /// Number of CPUs (online at detection time).
    pub fn num_cpus(&self) -> usize {
        self.cpus.len()
    }

    /// Number of NUMA nodes, including memory-only ones.
    pub fn num_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Index (into [`Topology::nodes`]) of the node holding `cpu`; 0 for a
    /// CPU the topology does not know (e.g. hot-plugged after detection).
    #[inline]
    pub fn node_of_cpu(&self, cpu: usize) -> usize {
        match self.cpu_to_node.get(cpu) {
            Some(&index) if index != NO_NODE => index,
            _ => 0,
        }
    }

    /// Index of the node whose kernel id is `id`, if there is one. On almost
    /// every machine ids are dense and this is the identity.
    #[inline]
    pub fn node_index_of_id(&self, id: usize) -> Option<usize> {
        self.node_index_by_id
            .get(id)
            .copied()
            .filter(|&index| index != NO_NODE)
    }

    /// Whether `cpu` is one of this topology's CPUs.
    pub fn contains_cpu(&self, cpu: usize) -> bool {
        self.cpu_to_node.get(cpu).is_some_and(|&i| i != NO_NODE)
    }

    /// Largest CPU id (0 if there are no CPUs). Per-CPU arrays need
    /// `max_cpu_id() + 1` slots, since ids can be sparse. A CPU hot-plugged
    /// after detection can exceed it, so index defensively.
    pub fn max_cpu_id(&self) -> usize {
        self.cpus.last().copied().unwrap_or(0)
    }
}

static TOPOLOGY: OnceLock<Topology> = OnceLock::new();

/// The machine's topology, detected on first use and cached for the life of
/// the process (CPU hotplug afterwards is not observed).
pub fn topology() -> &'static Topology {
    TOPOLOGY.get_or_init(Topology::detect)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::PathBuf;

    #[test]
    fn synthetic_four_nodes() {
        let t = Topology::synthetic(vec![
            vec![0, 1, 2, 3],
            vec![4, 5, 6, 7],
            vec![11, 10, 9, 8],
            vec![12, 13, 14, 15, 64],
        ]);
        assert_eq!(t.num_nodes(), 4);
        assert_eq!(t.num_cpus(), 17);
        assert_eq!(t.max_cpu_id(), 64);
        for cpu in 0..16 {
            assert_eq!(t.node_of_cpu(cpu), cpu / 4, "cpu {cpu}");
        }
        assert_eq!(t.node_of_cpu(64), 3);
        assert_eq!(t.nodes()[2].cpus, vec![8, 9, 10, 11]);
        // Unknown CPUs (gaps and beyond the end) map to node 0.
        assert_eq!(t.node_of_cpu(40), 0);
        assert_eq!(t.node_of_cpu(1000), 0);
        assert!(!t.contains_cpu(40));
        assert!(t.contains_cpu(64));
        assert_eq!(t.node_index_of_id(3), Some(3));
        assert_eq!(t.node_index_of_id(4), None);
    }

    #[test]
    fn synthetic_memory_only_node() {
        let t = Topology::synthetic(vec![vec![0, 1], vec![], vec![2, 3]]);
        assert_eq!(t.num_nodes(), 3);
        assert_eq!(t.node_of_cpu(2), 2);
        assert!(t.nodes()[1].cpus.is_empty());
    }

    #[test]
    #[should_panic(expected = "more than one node")]
    fn synthetic_rejects_shared_cpu() {
        Topology::synthetic(vec![vec![0, 1], vec![1, 2]]);
    }

    /// A scratch directory that removes itself.
    struct ScratchDir(PathBuf);
    impl ScratchDir {
        fn new(tag: &str) -> ScratchDir {
            let dir = std::env::temp_dir().join(format!(
                "topology-test-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            ScratchDir(dir)
        }
        fn node(&self, name: &str, cpulist: Option<&str>) {
            let d = self.0.join(name);
            fs::create_dir_all(&d).unwrap();
            if let Some(list) = cpulist {
                fs::write(d.join("cpulist"), list).unwrap();
            }
        }
    }
    impl Drop for ScratchDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn sysfs_sparse_nodes_offline_and_orphan_cpus() {
        let dir = ScratchDir::new("sparse");
        dir.node("node0", Some("0-3,8-11\n"));
        dir.node("node2", Some("4-7,12-15\n"));
        dir.node("node3", Some("\n")); // memory-only
        dir.node("node10", None); // unreadable cpulist
        dir.node("possible", None); // not a node
        fs::write(dir.0.join("has_cpu"), "0,2\n").unwrap();
        // CPU 15 offline, CPU 16 online but claimed by no node.
        let online: Vec<usize> = (0..15).chain([16]).collect();
        let t = Topology::from_sysfs(&dir.0, &online);

        let ids: Vec<usize> = t.nodes().iter().map(|n| n.id).collect();
        assert_eq!(ids, vec![0, 2, 3, 10]);
        assert_eq!(t.nodes()[0].cpus, vec![0, 1, 2, 3, 8, 9, 10, 11, 16]);
        assert_eq!(t.nodes()[1].cpus, vec![4, 5, 6, 7, 12, 13, 14]);
        assert!(t.nodes()[2].cpus.is_empty());
        assert_eq!(t.node_of_cpu(13), 1);
        assert_eq!(t.node_of_cpu(15), 0);
        assert!(!t.contains_cpu(15));
        assert_eq!(t.node_index_of_id(2), Some(1));
        assert_eq!(t.node_index_of_id(1), None);
        assert_eq!(t.node_index_of_id(10), Some(3));
        assert_eq!(t.num_cpus(), online.len());
        assert_eq!(t.max_cpu_id(), 16);
    }

    #[test]
    fn sysfs_without_nodes_is_one_node() {
        let dir = ScratchDir::new("flat");
        let t = Topology::from_sysfs(&dir.0.join("missing"), &[0, 1, 2, 5]);
        assert_eq!(
            t.nodes(),
            &[Node {
                id: 0,
                cpus: vec![0, 1, 2, 5]
            }]
        );
        assert_eq!(t.node_of_cpu(5), 0);
        assert_eq!(t.max_cpu_id(), 5);
    }

    #[test]
    fn this_machine_is_consistent() {
        let t = topology();
        let online = online_cpus();
        assert!(t.num_nodes() >= 1);
        assert_eq!(t.cpus(), online.as_slice());
        assert_eq!(t.num_cpus(), online.len());
        assert_eq!(t.max_cpu_id(), *online.last().unwrap());
        for &cpu in &online {
            let holders: Vec<usize> = t
                .nodes()
                .iter()
                .enumerate()
                .filter(|(_, n)| n.cpus.contains(&cpu))
                .map(|(i, _)| i)
                .collect();
            assert_eq!(holders.len(), 1, "cpu {cpu} in nodes {holders:?}");
            assert_eq!(t.node_of_cpu(cpu), holders[0]);
        }
        assert!(t.nodes().windows(2).all(|w| w[0].id < w[1].id));
    }
}
