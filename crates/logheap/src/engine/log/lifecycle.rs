//! The log engine's life outside the transaction path ([`EngineLifecycle`]): a new
//! pool file formatted with its superblock, open with recovery, figures, compaction,
//! the background cleaners, the check of a pool file, and a clean close that writes
//! the snapshot.

use std::ops::Range;
use std::sync::Arc;

use super::chunk_checks::Scrub;
use super::{CleanerThreads, Compaction, Examination, LogEngine, LogOptions};
use crate::config::Config;
use crate::engine::{
    Background, EngineConfig, EngineFigures, EngineLifecycle, EngineStats, NewPool,
};
use crate::error::Result;
use crate::file::{EngineKind, PoolFile, ReadOnlyPool};

/// The log engine's background work: its cleaners, and the scrub of the chunks an
/// open did not read ([`super::chunk_checks`]).
#[derive(Debug)]
struct LogBackground {
    #[allow(dead_code, reason = "held for its Drop, which stops the threads")]
    cleaners: CleanerThreads,
    #[allow(dead_code, reason = "held for its Drop, which stops the thread")]
    scrub: Option<Scrub>,
}

impl EngineLifecycle for LogEngine {
    const KIND: EngineKind = EngineKind::Log;
    type Options = LogOptions;

    fn options(config: &EngineConfig) -> Option<LogOptions> {
        match config {
            EngineConfig::Log(options) => Some(*options),
            _ => None,
        }
    }

    fn create(at: NewPool<'_>, config: &Config, options: LogOptions) -> Result<LogEngine> {
        let file = match at {
            NewPool::File(path) => {
                PoolFile::create_with(path, &config.pool_options(), |media, header| {
                    LogEngine::format(media, header)
                })?
            }
            NewPool::Sim(sim) => {
                let file = PoolFile::create_sim(&config.pool_options(), sim)?;
                LogEngine::format(file.media(), file.header());
                file
            }
        };
        <LogEngine as EngineLifecycle>::open(file, config, options)
    }

    fn open(file: PoolFile, config: &Config, options: LogOptions) -> Result<LogEngine> {
        LogEngine::open(file, &options, config.salvage)
    }

    fn file(&self) -> &PoolFile {
        &self.file
    }

    fn root(&self) -> Range<u64> {
        self.root.clone()
    }

    fn figures(&self) -> EngineFigures {
        let log = self.stats();
        EngineFigures {
            allocations: log.allocations,
            allocated_bytes: log.allocated_bytes,
            dram_bytes: log.mapping_dram_bytes + log.home_cache_dram_bytes,
            pm_bytes_used: (log.chunks_total - log.chunks_free) * self.geometry.size,
            engine: EngineStats::Log(Box::new(log)),
            data_checksums: false,
        }
    }

    fn compact(&self) -> Compaction {
        LogEngine::compact(self)
    }

    fn background(engine: &Arc<LogEngine>) -> Option<Background> {
        let weak = Arc::downgrade(engine);
        let scrub = Scrub::start(engine.chunks.checks().pending_chunks(), move |c| {
            weak.upgrade()
                .map(|e| e.chunks.checks().check(&e.media, &e.geometry, c))
                .is_some()
        });
        Some(Box::new(LogBackground {
            cleaners: CleanerThreads::start(engine),
            scrub,
        }))
    }

    fn examine(pool: &ReadOnlyPool) -> Result<Examination> {
        Ok(LogEngine::examine(
            &pool.media,
            &pool.header,
            pool.state.clean,
        ))
    }

    fn close(self) -> Result<()> {
        self.prepare_close();
        self.file.close()
    }
}
