//! Per-epoch progress bars (indicatif) that keep CI logs readable.
//!
//! On a terminal: `epoch 3/20 [=====>      ] 27/45 loss 0.412 acc 91.3%`, drawn on stderr, redrawn in
//! place and left on screen with the epoch's final numbers. When stdout or stderr is not a terminal
//! (CI, a pipe, a file) the bar is hidden and [`EpochBar::finish`] prints one summary line per epoch
//! on stdout instead.
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The progress bar of one training epoch.
pub struct EpochBar {
    bar: ProgressBar,
    epoch: u32,
    epochs: u32,
    interactive: bool,
    start: Instant,
}

impl EpochBar {
    /// A bar for epoch `epoch` (1-based, as shown) of `epochs`, with `steps` optimizer steps. Drawn
    /// on stderr when both stdout and stderr are terminals, hidden otherwise.
    pub fn new(epoch: u32, epochs: u32, steps: u64) -> Self {
        Self::with_terminal(epoch, epochs, steps, interactive())
    }

    /// Like [`EpochBar::new`] but with the terminal decision made by the caller: `true` draws the bar
    /// on stderr, `false` prints only the summary line on stdout at [`EpochBar::finish`].
    pub fn with_terminal(epoch: u32, epochs: u32, steps: u64, interactive: bool) -> Self {
        let target = if interactive {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(steps), target);
        bar.set_style(
            ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} {msg}")
                .expect("constant template is valid")
                .progress_chars("=> "),
        );
        bar.set_prefix(format!("{epoch}/{epochs}"));
        Self {
            bar,
            epoch,
            epochs,
            interactive,
            start: Instant::now(),
        }
    }

    /// One step done; `loss` and `acc` (a fraction in [0, 1]) are the running means so far.
    pub fn step(&self, loss: f32, acc: f32) {
        if self.interactive {
            self.bar
                .set_message(format!("loss {loss:.3} acc {:.1}%", acc * 100.0));
        }
        self.bar.inc(1);
    }

    /// Prints a line above the bar (or just the line when there is no bar).
    pub fn println(&self, line: &str) {
        if self.interactive {
            self.bar.suspend(|| println!("{line}"));
        } else {
            println!("{line}");
        }
    }

    /// Ends the epoch with its final training loss and accuracy and, when there is a test set, the
    /// test accuracy (fractions in [0, 1]). The bar stays on screen with these numbers; without a
    /// terminal, [`summary_line`] is printed instead. Returns that line.
    pub fn finish(self, loss: f32, acc: f32, test_acc: Option<f32>) -> String {
        let elapsed = self.start.elapsed();
        let line = summary_line(self.epoch, self.epochs, loss, acc, test_acc, elapsed);
        if self.interactive {
            let mut msg = format!("loss {loss:.3} acc {:.1}%", acc * 100.0);
            if let Some(t) = test_acc {
                msg.push_str(&format!(" test {:.1}%", t * 100.0));
            }
            msg.push_str(&format!(" ({:.1} s)", elapsed.as_secs_f64()));
            self.bar.finish_with_message(msg);
        } else {
            self.bar.finish_and_clear();
            println!("{line}");
        }
        line
    }
}

/// Whether bars should be drawn: stdout and stderr are both terminals.
pub fn interactive() -> bool {
    std::io::stdout().is_terminal() && std::io::stderr().is_terminal()
}

/// The one-line epoch summary: `epoch 3/20 loss 0.412 acc 91.3% test 90.0% (1.2 s)`.
pub fn summary_line(
    epoch: u32,
    epochs: u32,
    loss: f32,
    acc: f32,
    test_acc: Option<f32>,
    elapsed: Duration,
) -> String {
    let mut s = format!(
        "epoch {epoch}/{epochs} loss {loss:.3} acc {:.1}%",
        acc * 100.0
    );
    if let Some(t) = test_acc {
        s.push_str(&format!(" test {:.1}%", t * 100.0));
    }
    s.push_str(&format!(" ({:.1} s)", elapsed.as_secs_f64()));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_format() {
        assert_eq!(
            summary_line(
                3,
                20,
                0.41234,
                0.9131,
                Some(0.9),
                Duration::from_millis(1234)
            ),
            "epoch 3/20 loss 0.412 acc 91.3% test 90.0% (1.2 s)"
        );
        assert_eq!(
            summary_line(1, 1, 2.0, 0.1, None, Duration::ZERO),
            "epoch 1/1 loss 2.000 acc 10.0% (0.0 s)"
        );
    }

    #[test]
    fn hidden_bar_runs_and_summarises() {
        let bar = EpochBar::with_terminal(2, 5, 3, false);
        for _ in 0..3 {
            bar.step(0.5, 0.75);
        }
        let line = bar.finish(0.5, 0.75, None);
        assert!(
            line.starts_with("epoch 2/5 loss 0.500 acc 75.0% ("),
            "{line}"
        );
    }

    #[test]
    fn bar_message_format() {
        // The drawn bar, rendered without a terminal through indicatif's in-memory target.
        let bar = EpochBar::with_terminal(3, 20, 45, true);
        bar.bar.set_draw_target(ProgressDrawTarget::hidden());
        for _ in 0..27 {
            bar.step(0.412, 0.913);
        }
        assert_eq!(bar.bar.message(), "loss 0.412 acc 91.3%");
        assert_eq!(bar.bar.prefix(), "3/20");
        assert_eq!(bar.bar.position(), 27);
        bar.bar.finish_and_clear();
    }
}
