//! The interpreter. (being written)
