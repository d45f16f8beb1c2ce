//! Transaction engines. Every engine sits behind the same API; the pool header records
//! which one formatted a pool.

mod kind;

pub use kind::EngineKind;
