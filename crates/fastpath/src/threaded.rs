//! Fast and slow path on their own threads.
