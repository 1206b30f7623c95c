//! registry (placeholder)
