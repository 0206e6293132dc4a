//! The child side: one process's job (load, then every (distribution,
//! workload) at one thread count on one store) and its result cells.

use super::*;

/// One child's work: load, then every (distribution, workload) at one
/// thread count, on one store.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct YcsbJob {
    pub system: System,
    pub threads: usize,
    pub records: u64,
    pub value_size: usize,
    pub workloads: Vec<Workload>,
    pub distributions: Vec<Dist>,
    pub warmup_ms: u64,
    pub measure_ms: u64,
    pub capacity: usize,
    pub seed: u64,
}

/// One measured cell.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct YcsbCell {
    /// `load`, `A`, `B`, `C`, `F`.
    pub workload: String,
    /// None for the load.
    pub distribution: Option<String>,
    pub threads: usize,
    pub ops: u64,
    pub ops_per_sec: f64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    /// Minor page faults of the process per operation (the load only).
    #[serde(default)]
    pub minflt_per_op: f64,
    #[serde(flatten)]
    pub checks: Checks,
}

pub fn cell_of(workload: &str, dist: Option<Dist>, threads: usize, r: &PhaseResult) -> YcsbCell {
    YcsbCell {
        workload: workload.to_string(),
        distribution: dist.map(|d| d.name().to_string()),
        threads,
        ops: r.ops,
        ops_per_sec: r.ops_per_sec,
        p50_ns: r.p_ns(0.5),
        p99_ns: r.p_ns(0.99),
        minflt_per_op: r.minflt as f64 / r.ops.max(1) as f64,
        checks: r.checks.clone(),
    }
}

/// Run a job (in the child).
pub fn run_job(job: &YcsbJob, emit: &mut dyn FnMut(YcsbCell)) -> Result<()> {
    let cpus = util::online_cpus();
    let cells = (job.workloads.len() * job.distributions.len()) as u32;
    let _wd = Watchdog::arm(
        Duration::from_millis(job.warmup_ms + job.measure_ms) * cells
            + Duration::from_micros(40 * job.records)
            + HANG_GRACE,
        format!("ycsb {} threads={}", job.system, job.threads),
    );
    // Every system is told the record count, as a map's `with_capacity`
    // (Nibble: its index pre-sized).
    let kv = job.system.build_for(job.capacity, job.records as usize)?;
    let kv: &dyn Kv = &*kv;
    let (r, pass) = load(
        kv,
        job.records,
        job.value_size,
        job.threads,
        &cpus,
        job.seed,
    )
    .with_context(|| format!("ycsb {} threads={}", job.system, job.threads))?;
    emit(cell_of("load", None, job.threads, &r));
    // The overwrite pass's failed writes are reported with the first
    // measured cell's.
    let mut carry = Some(pass.checks);
    for &dist in &job.distributions {
        for &workload in &job.workloads {
            let spec = RunSpec {
                workload,
                dist,
                records: job.records,
                value_size: job.value_size,
                threads: job.threads,
                warmup: Duration::from_millis(job.warmup_ms),
                duration: Duration::from_millis(job.measure_ms),
                seed: job.seed ^ ((workload as u64) << 8 | dist as u64),
            };
            let r = run_workload(kv, &spec, &cpus).with_context(|| {
                format!(
                    "ycsb {} {} {} threads={}",
                    job.system,
                    workload.name(),
                    dist.name(),
                    job.threads
                )
            })?;
            let mut cell = cell_of(workload.name(), Some(dist), job.threads, &r);
            if let Some(c) = carry.take() {
                cell.checks.add(c);
            }
            emit(cell);
        }
    }
    Ok(())
}
