//! Per-tenant device memory: a byte budget, and freed blocks kept by size class for reuse.
//!
//! [`PoolAccounting`] is the pure bookkeeping (no CUDA), so the rules are tested on any machine;
//! [`DevicePool`] pairs it with the actual `CudaSlice` free lists. Everything a tenant holds on the
//! device counts against its budget: live blocks, cached free blocks and resident weights. A
//! fresh block that does not fit evicts cached blocks first; if it still does not fit, that
//! tenant's allocation fails with [`OverBudget`] and nothing else changes.

use std::collections::BTreeMap;
use std::fmt;

/// A tenant asked for more device memory than its budget allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverBudget {
    pub tenant: String,
    /// Bytes asked for (before rounding to a size class).
    pub requested: u64,
    pub budget: u64,
    /// Bytes the tenant had in use (live blocks and resident weights) when it asked.
    pub in_use: u64,
}

impl fmt::Display for OverBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tenant {:?}: device memory over budget: asked for {} bytes with {} of {} in use",
            self.tenant, self.requested, self.in_use, self.budget
        )
    }
}

impl std::error::Error for OverBudget {}

/// Smallest block handed out.
pub const MIN_CLASS: u64 = 256;

/// The size class of a request: at least [`MIN_CLASS`], then four classes per power of two
/// (2^k · {1, 1.25, 1.5, 1.75}), so rounding wastes at most a fifth. Always a multiple of 64.
pub fn size_class(bytes: u64) -> u64 {
    if bytes <= MIN_CLASS {
        return MIN_CLASS;
    }
    let k = 63 - bytes.leading_zeros() as u64; // 2^k <= bytes < 2^(k+1)
    let quarter = 1u64 << (k - 2);
    bytes.div_ceil(quarter) * quarter
}

/// What [`PoolAccounting::allocate`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The block's size class (bytes actually reserved).
    pub class: u64,
    /// A cached free block of this class is reused (no device allocation).
    pub reused: bool,
    /// Cached free blocks (by class) to release to the device first, to make room.
    pub evict: Vec<u64>,
}

/// Byte accounting of one tenant's device memory.
#[derive(Clone, Debug)]
pub struct PoolAccounting {
    tenant: String,
    budget: u64,
    /// Bytes of live blocks handed out.
    live: u64,
    /// Bytes of resident data outside the block cache (weights).
    resident: u64,
    /// Bytes of cached free blocks.
    cached: u64,
    /// Cached free blocks per class.
    free: BTreeMap<u64, usize>,
    peak: u64,
}

impl PoolAccounting {
    pub fn new(tenant: impl Into<String>, budget: u64) -> PoolAccounting {
        PoolAccounting {
            tenant: tenant.into(),
            budget,
            live: 0,
            resident: 0,
            cached: 0,
            free: BTreeMap::new(),
            peak: 0,
        }
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }
    pub fn budget(&self) -> u64 {
        self.budget
    }
    /// Live blocks plus resident weights.
    pub fn in_use(&self) -> u64 {
        self.live + self.resident
    }
    pub fn cached(&self) -> u64 {
        self.cached
    }
    /// Everything held on the device (in use plus cached).
    pub fn held(&self) -> u64 {
        self.in_use() + self.cached
    }
    pub fn peak(&self) -> u64 {
        self.peak
    }
    /// Cached free blocks of `class`.
    pub fn free_blocks(&self, class: u64) -> usize {
        self.free.get(&class).copied().unwrap_or(0)
    }

    fn over(&self, requested: u64) -> OverBudget {
        OverBudget {
            tenant: self.tenant.clone(),
            requested,
            budget: self.budget,
            in_use: self.in_use(),
        }
    }

    /// Evicts cached blocks, largest first, until `need` more bytes fit in the budget.
    fn make_room(&mut self, need: u64) -> Vec<u64> {
        let mut evict = Vec::new();
        while self.held() + need > self.budget {
            let Some((&class, count)) = self.free.iter_mut().next_back() else {
                break;
            };
            *count -= 1;
            if *count == 0 {
                self.free.remove(&class);
            }
            self.cached -= class;
            evict.push(class);
        }
        evict
    }

    /// A block for `bytes`: a cached one of the same class, else a fresh one if the budget
    /// allows (after evicting cached blocks), else `OverBudget` with nothing changed.
    pub fn allocate(&mut self, bytes: u64) -> Result<Grant, OverBudget> {
        let class = size_class(bytes);
        if let Some(count) = self.free.get_mut(&class) {
            *count -= 1;
            if *count == 0 {
                self.free.remove(&class);
            }
            self.cached -= class;
            self.live += class;
            self.peak = self.peak.max(self.held());
            return Ok(Grant {
                class,
                reused: true,
                evict: vec![],
            });
        }
        if self.in_use().saturating_add(class) > self.budget {
            return Err(self.over(bytes));
        }
        let evict = self.make_room(class);
        self.live += class;
        self.peak = self.peak.max(self.held());
        Ok(Grant {
            class,
            reused: false,
            evict,
        })
    }

    /// A live block of `class` comes back and is cached for reuse.
    pub fn free(&mut self, class: u64) {
        debug_assert!(self.live >= class, "freeing more than is live");
        let class = class.min(self.live);
        self.live -= class;
        self.cached += class;
        *self.free.entry(class).or_insert(0) += 1;
    }

    /// A live block of `class` is released to the device instead of cached.
    pub fn release(&mut self, class: u64) {
        self.live = self.live.saturating_sub(class);
    }

    /// Reserves `bytes` of resident data (weights), evicting cached blocks if needed.
    pub fn reserve_resident(&mut self, bytes: u64) -> Result<Vec<u64>, OverBudget> {
        if self.in_use().saturating_add(bytes) > self.budget {
            return Err(self.over(bytes));
        }
        let evict = self.make_room(bytes);
        self.resident += bytes;
        self.peak = self.peak.max(self.held());
        Ok(evict)
    }

    pub fn release_resident(&mut self, bytes: u64) {
        self.resident = self.resident.saturating_sub(bytes);
    }

    /// Forgets every live block: between ops of a run nothing is live (outputs go back to the
    /// host), so the backend calls this after each op, which also heals the count after an op
    /// that failed halfway and dropped its blocks instead of returning them.
    pub fn reset_live(&mut self) {
        self.live = 0;
    }

    /// Drops every cached block (returns their classes, to free on the device).
    pub fn trim(&mut self) -> Vec<u64> {
        let mut out = Vec::new();
        for (class, count) in std::mem::take(&mut self.free) {
            out.extend(std::iter::repeat_n(class, count));
        }
        self.cached = 0;
        out
    }
}

/// One tenant's device memory: accounting plus the cached `CudaSlice`s.
pub struct DevicePool {
    pub acct: PoolAccounting,
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
    free: std::collections::HashMap<u64, Vec<cudarc::driver::CudaSlice<f32>>>,
}

/// A block from a [`DevicePool`]: `len` f32s in use of a slice sized to its class.
pub struct Block {
    pub slice: cudarc::driver::CudaSlice<f32>,
    pub len: usize,
    pub class: u64,
}

impl Block {
    /// The `len` elements in use.
    pub fn view(&self) -> cudarc::driver::CudaView<'_, f32> {
        self.slice.slice(0..self.len)
    }
    pub fn view_mut(&mut self) -> cudarc::driver::CudaViewMut<'_, f32> {
        self.slice.slice_mut(0..self.len)
    }
}

/// Why a device allocation failed.
#[derive(Debug)]
pub enum AllocError {
    OverBudget(OverBudget),
    Driver(cudarc::driver::DriverError),
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::OverBudget(o) => o.fmt(f),
            AllocError::Driver(e) => write!(f, "device allocation: {e}"),
        }
    }
}

impl DevicePool {
    pub fn new(
        tenant: impl Into<String>,
        budget: u64,
        stream: std::sync::Arc<cudarc::driver::CudaStream>,
    ) -> DevicePool {
        DevicePool {
            acct: PoolAccounting::new(tenant, budget),
            stream,
            free: Default::default(),
        }
    }

    fn drop_cached(&mut self, classes: &[u64]) {
        for c in classes {
            if let Some(list) = self.free.get_mut(c) {
                list.pop();
            }
        }
    }

    /// A block of `len` f32s with unspecified contents.
    pub fn alloc(&mut self, len: usize) -> Result<Block, AllocError> {
        let grant = self
            .acct
            .allocate(len as u64 * 4)
            .map_err(AllocError::OverBudget)?;
        self.drop_cached(&grant.evict);
        let reused = if grant.reused {
            self.free.get_mut(&grant.class).and_then(Vec::pop)
        } else {
            None
        };
        let slice = match reused {
            Some(s) => s,
            None => {
                // SAFETY: the contents are unspecified; every launcher writes before it reads.
                match unsafe { self.stream.alloc::<f32>((grant.class / 4) as usize) } {
                    Ok(s) => s,
                    Err(e) => {
                        self.acct.release(grant.class);
                        return Err(AllocError::Driver(e));
                    }
                }
            }
        };
        Ok(Block {
            slice,
            len,
            class: grant.class,
        })
    }

    /// Takes a block back for reuse.
    pub fn free(&mut self, b: Block) {
        self.acct.free(b.class);
        self.free.entry(b.class).or_default().push(b.slice);
    }

    /// Resident data (weights) of `bytes`: counted against the budget until `release_resident`.
    pub fn reserve_resident(&mut self, bytes: u64) -> Result<(), OverBudget> {
        let evict = self.acct.reserve_resident(bytes)?;
        self.drop_cached(&evict);
        Ok(())
    }

    pub fn release_resident(&mut self, bytes: u64) {
        self.acct.release_resident(bytes);
    }

    /// Frees every cached block on the device.
    pub fn trim(&mut self) {
        self.acct.trim();
        self.free.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_round_up_at_most_a_quarter() {
        assert_eq!(size_class(0), 256);
        assert_eq!(size_class(256), 256);
        assert_eq!(size_class(257), 320);
        assert_eq!(size_class(1024), 1024);
        assert_eq!(size_class(1025), 1280);
        assert_eq!(size_class(1 << 20), 1 << 20);
        for b in [300u64, 4097, 123_457, 10_000_000, 602_112 * 4] {
            let c = size_class(b);
            assert!(
                c >= b && c.is_multiple_of(64) && (c - b) * 4 <= c,
                "{b} -> {c}"
            );
            assert_eq!(size_class(c), c, "classes are fixed points");
        }
    }

    #[test]
    fn freed_blocks_are_reused_by_class() {
        let mut p = PoolAccounting::new("a", 1 << 20);
        let g = p.allocate(1000).unwrap();
        assert_eq!((g.class, g.reused), (1024, false));
        assert_eq!(p.in_use(), 1024);
        p.free(g.class);
        assert_eq!((p.in_use(), p.cached(), p.free_blocks(1024)), (0, 1024, 1));
        // Same class (900 rounds to 1024): reused; a different class is fresh.
        let g2 = p.allocate(900).unwrap();
        assert!(g2.reused);
        assert_eq!((p.in_use(), p.cached()), (1024, 0));
        let g3 = p.allocate(5000).unwrap();
        assert!(!g3.reused);
        assert_eq!(p.in_use(), 1024 + size_class(5000));
        p.free(g2.class);
        p.free(g3.class);
        assert_eq!(p.in_use(), 0);
        assert_eq!(p.held(), 1024 + size_class(5000));
        assert_eq!(p.peak(), 1024 + size_class(5000));
    }

    #[test]
    fn over_budget_is_typed_and_changes_nothing() {
        let mut p = PoolAccounting::new("bert", 4096);
        let a = p.allocate(3000).unwrap();
        let before = (p.in_use(), p.cached(), p.held());
        let e = p.allocate(2000).unwrap_err();
        assert_eq!(
            e,
            OverBudget {
                tenant: "bert".into(),
                requested: 2000,
                budget: 4096,
                in_use: a.class,
            }
        );
        assert!(e.to_string().contains("bert"));
        assert_eq!((p.in_use(), p.cached(), p.held()), before);
        // Weights count too.
        assert!(p.reserve_resident(2000).is_err());
        p.free(a.class);
        p.reserve_resident(2000).unwrap();
        assert_eq!(p.in_use(), 2000);
        p.release_resident(2000);
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn cached_blocks_are_evicted_to_make_room() {
        let mut p = PoolAccounting::new("t", 8192);
        let a = p.allocate(4096).unwrap();
        let b = p.allocate(2048).unwrap();
        p.free(a.class);
        p.free(b.class);
        assert_eq!(p.held(), 6144);
        // 5000 → 5120: does not fit beside 6144 cached; the largest cached block goes first.
        let g = p.allocate(5000).unwrap();
        assert_eq!(g.evict, vec![4096]);
        assert_eq!(p.held(), 5120 + 2048);
        assert_eq!(p.free_blocks(4096), 0);
        assert_eq!(p.free_blocks(2048), 1);
        assert_eq!(p.trim(), vec![2048]);
        assert_eq!(p.held(), 5120);
    }

    #[test]
    fn accounting_never_goes_negative() {
        // A small deterministic random walk of allocations and frees.
        let mut p = PoolAccounting::new("walk", 1 << 16);
        let mut live: Vec<u64> = Vec::new();
        let mut x: u64 = 12345;
        for _ in 0..2000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = x >> 33;
            if r.is_multiple_of(3) && !live.is_empty() {
                let c = live.swap_remove((r as usize / 3) % live.len());
                p.free(c);
            } else {
                match p.allocate(r % 9000) {
                    Ok(g) => live.push(g.class),
                    Err(e) => assert!(e.in_use + size_class(e.requested) > e.budget),
                }
            }
            assert_eq!(p.in_use(), live.iter().sum::<u64>());
            assert!(p.held() <= p.budget());
            let cached: u64 = p.free.iter().map(|(c, n)| c * *n as u64).sum();
            assert_eq!(cached, p.cached());
        }
        p.reset_live();
        assert_eq!(p.in_use(), 0);
        p.release(u64::MAX);
        assert_eq!(p.in_use(), 0);
    }
}
