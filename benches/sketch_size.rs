//! Bytes of a window's sketch (docs/reference.md#group_defaults-and-groupsname
//! `quantile_accuracy`): the struct and its buckets once the window has fired
//! (shrunk to fit), by accuracy, readings per window and distribution. Prints a
//! table; `cargo bench --bench sketch_size`.

use tidemark::time::sketch::Sketch;

fn main() {
    let mut rng: u64 = 0x2545_F491_4F6C_DD1D;
    let mut unit = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 11) as f64 / (1u64 << 53) as f64
    };
    type Shape = (&'static str, fn(f64) -> f64);
    let shapes: [Shape; 3] = [
        ("uniform 15..25 (table 16)", |u| 15.0 + 10.0 * u),
        ("Pareto, alpha 1.1", |u| {
            (1.0 - u).max(1e-12).powf(-1.0 / 1.1)
        }),
        ("normal-ish around 0", |u| (u - 0.5) * 40.0),
    ];
    println!("| readings in the window | distribution | accuracy | buckets | bytes |");
    println!("|---|---|---|---|---|");
    for n in [10usize, 60, 600, 6000] {
        for (name, f) in &shapes {
            for alpha in [0.01, 0.05] {
                let mut s = Sketch::new(alpha);
                for _ in 0..n {
                    s.add(f(unit()));
                }
                s.shrink();
                let bytes = std::mem::size_of::<Sketch>() + s.bins() * 8;
                println!("| {n} | {name} | {alpha} | {} | {bytes} |", s.bins());
            }
        }
    }
    println!(
        "\nA bucket is 8 bytes (key, count); the struct {} bytes; at most 1024 buckets a side.",
        std::mem::size_of::<Sketch>()
    );
}
