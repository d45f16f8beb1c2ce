//! Which engine a pool runs, with that engine's own options: [`EngineConfig`], whose
//! [`FromStr`] and [`Display`](fmt::Display) are the engine names users type (`log`,
//! `log-2l-gu`, `redo-fastlog`, `undo-adaptive`, ...).

use std::fmt;
use std::str::FromStr;

use super::inplace::options::{RedoOptions, UndoOptions};
use super::inplace::persist_policy::PersistPolicy;
use super::log::{LogOptions, MappingConfig};
use crate::file::EngineKind;

/// The engine of a pool and its options (see [`Config::engine`](crate::Config::engine)).
///
/// Parsed from and displayed as the engine names of the CLI and the docs:
///
/// ```
/// use logheap::{EngineConfig, EngineKind};
/// let e: EngineConfig = "undo-adaptive".parse()?;
/// assert_eq!(e.kind(), EngineKind::Undo);
/// assert_eq!(e.to_string(), "undo-adaptive");
/// assert_eq!("log".parse::<EngineConfig>()?, EngineConfig::default());
/// # Ok::<(), String>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum EngineConfig {
    /// The log-structured engine ("Log-structured Non-volatile Main Memory", USENIX ATC
    /// 2017), the default. Names: `log` (all mapping optimisations and the DRAM home
    /// cache), `log-nocache` (the same without the cache), and the paper's ablation
    /// ladder `log-base`, `log-2l`, `log-2l-gu`, `log-2l-gu-c` (and the other labels of
    /// [`MappingConfig::named`]), which read through the mapping as the paper did (no
    /// home cache). A configuration with another cache budget is displayed by its
    /// mapping's name.
    Log(LogOptions),
    /// Redo logging, data in place (Mnemosyne-style). Names: `redo`, `redo-fastlog`.
    Redo(RedoOptions),
    /// Undo logging, data in place (PMDK-style, with 004's hybrid logging). Names:
    /// `undo`, `undo-fastlog`, `undo-nt`, `undo-uc`, `undo-adaptive` (and
    /// `undo-fastlog-nt` and so on, both options at once).
    Undo(UndoOptions),
    /// Out-of-place update (003's EAOOP). Name: `oop`.
    Oop,
    /// HOOP, out-of-place updates into logs written home by collections. Name: `hoop`.
    Hoop,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig::Log(LogOptions::default())
    }
}

impl EngineConfig {
    /// The engine.
    pub fn kind(&self) -> EngineKind {
        match self {
            EngineConfig::Log(_) => EngineKind::Log,
            EngineConfig::Redo(_) => EngineKind::Redo,
            EngineConfig::Undo(_) => EngineKind::Undo,
            EngineConfig::Oop => EngineKind::Oop,
            EngineConfig::Hoop => EngineKind::Hoop,
        }
    }

    /// The engine `kind` with its default options; `None` for
    /// [`EngineKind::Alloc`], which is no transaction engine.
    pub fn of_kind(kind: EngineKind) -> Option<EngineConfig> {
        Some(match kind {
            EngineKind::Log => EngineConfig::Log(LogOptions::default()),
            EngineKind::Redo => EngineConfig::Redo(RedoOptions::default()),
            EngineKind::Undo => EngineConfig::Undo(UndoOptions::default()),
            EngineKind::Oop => EngineConfig::Oop,
            EngineKind::Hoop => EngineConfig::Hoop,
            EngineKind::Alloc => return None,
        })
    }

    /// The name of the first option set to other than its default, if any.
    pub(crate) fn first_changed(&self) -> Option<&'static str> {
        match self {
            EngineConfig::Log(o) => o.first_changed(),
            EngineConfig::Redo(o) => o.fast_log.then_some("fast_log"),
            EngineConfig::Undo(o) => match (o.fast_log, o.persist_policy) {
                (true, _) => Some("fast_log"),
                (false, PersistPolicy::WriteBack) => None,
                (false, _) => Some("persist_policy"),
            },
            EngineConfig::Oop | EngineConfig::Hoop => None,
        }
    }
}

/// What [`Config::engine`](crate::Config::engine) takes: an [`EngineKind`] (the engine
/// with its default options), an [`EngineConfig`], or one engine's options
/// ([`LogOptions`], [`RedoOptions`], [`UndoOptions`]).
pub trait EngineChoice {
    /// The engine configuration chosen, or `Err` with the kind when it names no
    /// transaction engine ([`EngineKind::Alloc`]).
    fn into_engine_config(self) -> Result<EngineConfig, EngineKind>;
}

impl EngineChoice for EngineKind {
    fn into_engine_config(self) -> Result<EngineConfig, EngineKind> {
        EngineConfig::of_kind(self).ok_or(self)
    }
}

impl<T: Into<EngineConfig>> EngineChoice for T {
    fn into_engine_config(self) -> Result<EngineConfig, EngineKind> {
        Ok(self.into())
    }
}

impl From<LogOptions> for EngineConfig {
    fn from(options: LogOptions) -> Self {
        EngineConfig::Log(options)
    }
}

impl From<RedoOptions> for EngineConfig {
    fn from(options: RedoOptions) -> Self {
        EngineConfig::Redo(options)
    }
}

impl From<UndoOptions> for EngineConfig {
    fn from(options: UndoOptions) -> Self {
        EngineConfig::Undo(options)
    }
}

const FAST_LOG: &str = "-fastlog";
/// The log engine with every mapping optimisation and no home cache.
const NO_CACHE: &str = "log-nocache";

impl FromStr for EngineConfig {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        if name == "log" {
            return Ok(EngineConfig::Log(LogOptions::default()));
        }
        if name == NO_CACHE {
            return Ok(EngineConfig::Log(LogOptions::default().home_cache(0)));
        }
        // The paper's ablation ladder: its mapping configurations, reads through the
        // mapping (no home cache), as the paper measured them.
        if let Some(rest) = name.strip_prefix("log-")
            && let Some(mapping) = MappingConfig::named(rest).filter(|_| rest != "full")
        {
            return Ok(EngineConfig::Log(
                LogOptions::default().mapping(mapping).home_cache(0),
            ));
        }
        // An in-place engine: a base name, then `-fastlog`, then a persist policy.
        let mut base = name;
        let mut policy = PersistPolicy::WriteBack;
        for p in PersistPolicy::ALL.into_iter().skip(1) {
            if let Some(b) = base.strip_suffix(p.suffix()) {
                base = b;
                policy = p;
                break;
            }
        }
        let fast_log = match base.strip_suffix(FAST_LOG) {
            Some(b) => {
                base = b;
                true
            }
            None => false,
        };
        let kind: EngineKind = base.parse()?;
        match kind {
            EngineKind::Undo => Ok(EngineConfig::Undo(UndoOptions {
                fast_log,
                persist_policy: policy,
            })),
            _ if policy != PersistPolicy::WriteBack => Err(format!(
                "{name}: only undo takes a persist policy (undo-nt, undo-uc, undo-adaptive)"
            )),
            EngineKind::Redo => Ok(EngineConfig::Redo(RedoOptions { fast_log })),
            _ if fast_log => Err(format!(
                "{name}: only redo and undo have a fast log (redo-fastlog, undo-fastlog)"
            )),
            EngineKind::Alloc => Err(format!(
                "{name}: a bare persistent heap, not a transaction engine (alloc::PersistentHeap)"
            )),
            kind => EngineConfig::of_kind(kind).ok_or_else(|| format!("{name}: unknown engine")),
        }
    }
}

impl fmt::Display for EngineConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineConfig::Log(o) if o.mapping == MappingConfig::FULL && o.home_cache == 0 => {
                f.write_str(NO_CACHE)
            }
            EngineConfig::Log(o) if o.mapping == MappingConfig::FULL => f.write_str("log"),
            EngineConfig::Log(o) => write!(f, "log-{}", o.mapping.label()),
            EngineConfig::Redo(o) => {
                write!(f, "redo{}", if o.fast_log { FAST_LOG } else { "" })
            }
            EngineConfig::Undo(o) => write!(
                f,
                "undo{}{}",
                if o.fast_log { FAST_LOG } else { "" },
                o.persist_policy.suffix()
            ),
            EngineConfig::Oop => f.write_str("oop"),
            EngineConfig::Hoop => f.write_str("hoop"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for name in [
            "log",
            "log-nocache",
            "log-base",
            "log-2l",
            "log-2l-gu",
            "log-2l-gu-c",
            "log-2l-skiplist",
            "log-2l-gu-skiplist",
            "log-2l-gu-c-skiplist",
            "log-full-skiplist",
            "redo",
            "redo-fastlog",
            "undo",
            "undo-fastlog",
            "undo-nt",
            "undo-uc",
            "undo-adaptive",
            "undo-fastlog-nt",
            "oop",
            "hoop",
        ] {
            let e: EngineConfig = name.parse().unwrap();
            assert_eq!(e.to_string(), name);
        }
        let e: EngineConfig = "log-2l-gu".parse().unwrap();
        assert_eq!(e.kind(), EngineKind::Log);
        assert_ne!(e, EngineConfig::default());
        for bad in [
            "redo-nt",
            "oop-fastlog",
            "alloc",
            "lsm",
            "log-full",
            "undo-nt-fastlog",
        ] {
            assert!(bad.parse::<EngineConfig>().is_err(), "{bad}");
        }
    }
}
