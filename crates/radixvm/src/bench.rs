//! `mapbench` (RadixVM §5) and `faultbench` (Bonsai Fig. 16-18): in progress.
