package ai.frugal;

import java.nio.file.Files;
import java.nio.file.Paths;

/**
 * The JNI binding on the host JVM (run by `cargo xtask android` with -Xcheck:jni):
 *
 *   java -Djava.library.path=DIR -cp CLASSES ai.frugal.TrainerTest MODEL TRAIN-IMAGES TRAIN-LABELS TEST-IMAGES TEST-LABELS
 *
 * Trains the digits MLP on a background thread while simulated trim-memory callbacks and
 * MemoryInfo readings move the budget through MemoryBudget, and checks after each that the trainer's
 * budget is the policy's and its plan fits it; predicts; walks the exceptions (bad arguments, a
 * budget below the smallest plan, a trainer busy in another thread, a closed trainer).
 */
public final class TrainerTest {
    static int passed, failed;

    static void check(boolean ok, String what) {
        if (ok) {
            passed++;
        } else {
            failed++;
            System.err.println("FAILED: " + what);
        }
    }

    interface Call {
        void run();
    }

    static void expectCode(int code, Call c, String what) {
        try {
            c.run();
            check(false, what + ": no exception, want code " + code);
        } catch (FrugalException e) {
            check(e.code == code && !e.getMessage().isEmpty(),
                    what + ": code " + e.code + " (" + e.getMessage() + "), want " + code);
        }
    }

    static float[][] digits(String images, String labels) throws Exception {
        byte[] im = Files.readAllBytes(Paths.get(images)), lb = Files.readAllBytes(Paths.get(labels));
        int n = lb.length - 8;
        float[] x = new float[n * 64];
        float[] y = new float[n];
        for (int i = 0; i < n * 64; i++) x[i] = (im[16 + i] & 0xff) / 16.0f;
        for (int i = 0; i < n; i++) y[i] = lb[8 + i] & 0xff;
        return new float[][] {x, y};
    }

    static float[] row(float[] x, int i) {
        float[] r = new float[64];
        System.arraycopy(x, i * 64, r, 0, 64);
        return r;
    }

    /** Waits until the trainer has taken `steps` steps (fails after 60 s instead of hanging). */
    static void waitSteps(Trainer t, int steps) throws InterruptedException {
        long until = System.nanoTime() + 60_000_000_000L;
        while (t.planInfo().steps < steps) {
            if (System.nanoTime() > until) throw new AssertionError("training stalled before step " + steps);
            Thread.sleep(1);
        }
    }

    public static void main(String[] args) throws Exception {
        byte[] model = Files.readAllBytes(Paths.get(args[0]));
        float[][] train = digits(args[1], args[2]), test = digits(args[3], args[4]);
        int n = train[1].length, tn = test[1].length;

        // Errors at creation.
        expectCode(FrugalException.MODEL, () -> Trainer.create(new byte[] {1, 2, 3}, null, Trainer.UNLIMITED, null), "junk model");
        expectCode(FrugalException.NULL_POINTER, () -> Trainer.create(null, null, Trainer.UNLIMITED, null), "null model");
        expectCode(FrugalException.WEIGHTS, () -> Trainer.create(model, new byte[] {9}, Trainer.UNLIMITED, null), "junk weights");
        expectCode(FrugalException.ARGUMENT, () -> Trainer.create(model, null, -5, null), "negative budget");
        try {
            Trainer.create(model, null, 1000, null);
            check(false, "a 1000-byte budget was accepted");
        } catch (FrugalException e) {
            check(e.code == FrugalException.BUDGET && e.neededBytes > 1000, "budget error names the floor: " + e.neededBytes);
        }

        Trainer.Options o = new Trainer.Options();
        o.seed = 7L;
        Trainer t = Trainer.create(model, null, Trainer.UNLIMITED, o);
        long floor = t.planInfo().floorBytes, ceiling = 4 * floor;
        MemoryBudget mb = new MemoryBudget(t, ceiling);
        check(mb.clearTrim() == ceiling && t.planInfo().budget == ceiling, "no pressure: the ceiling");

        expectCode(FrugalException.ARGUMENT, () -> t.addSample(new float[63], 0), "63 values");
        expectCode(FrugalException.ARGUMENT, () -> t.addSample(new float[64], 10), "label 10");
        expectCode(FrugalException.ARGUMENT, () -> t.addSample(new float[64], -1), "label -1");
        expectCode(FrugalException.NULL_POINTER, () -> t.addSample(null, 0), "null sample");
        expectCode(FrugalException.ARGUMENT, () -> t.trainSteps(1), "no samples");
        expectCode(FrugalException.ARGUMENT, () -> t.predict(new float[65]), "65 values");
        try {
            t.setBudget(floor - 1);
            check(false, "a budget below the floor was accepted");
        } catch (FrugalException e) {
            check(e.code == FrugalException.BUDGET && e.neededBytes == floor, "setBudget names the floor");
        }
        check(t.planInfo().budget == ceiling, "a refused budget changes nothing");

        for (int i = 0; i < n; i++) t.addSample(row(train[0], i), (int) train[1][i]);

        // Train on a background thread; the "system" sends memory signals meanwhile.
        // It trains an epoch per call until told to stop (at least 14 epochs).
        int epoch = (n + 31) / 32;
        java.util.List<float[]> losses = new java.util.ArrayList<>();
        Throwable[] thrown = new Throwable[1];
        java.util.concurrent.atomic.AtomicBoolean stop = new java.util.concurrent.atomic.AtomicBoolean();
        Thread bg = new Thread(() -> {
            try {
                while (!stop.get() || losses.size() < 14) losses.add(t.trainSteps(epoch));
            } catch (Throwable e) {
                thrown[0] = e;
            }
        });
        bg.start();
        waitSteps(t, 2);
        expectCode(FrugalException.BUSY, () -> t.addSample(new float[64], 0), "busy addSample");
        expectCode(FrugalException.BUSY, () -> t.predict(new float[64]), "busy predict");
        expectCode(FrugalException.BUSY, () -> t.exportWeights(), "busy exportWeights");

        // Each signal: the budget is the policy's (as the pure function computes it), set at once.
        int[] levels = {
            MemoryBudget.TRIM_MEMORY_RUNNING_MODERATE, MemoryBudget.TRIM_MEMORY_RUNNING_LOW,
            MemoryBudget.TRIM_MEMORY_RUNNING_CRITICAL, MemoryBudget.TRIM_MEMORY_UI_HIDDEN,
            MemoryBudget.TRIM_MEMORY_COMPLETE
        };
        long[] want = {ceiling / 2, ceiling / 4, floor, ceiling, floor};
        for (int k = 0; k < levels.length; k++) {
            long b = mb.onTrimMemory(levels[k]);
            check(b == want[k], "level " + levels[k] + ": budget " + b + ", want " + want[k]);
            check(b == MemoryBudget.budgetFor(ceiling, floor, levels[k], 0, 0, false), "the pure function agrees");
            check(t.planInfo().budget == b, "the trainer's budget follows level " + levels[k]);
            int at = t.planInfo().steps;
            waitSteps(t, at + 2);
            Trainer.PlanInfo p = t.planInfo();
            check(p.allocatedBytes <= b, "level " + levels[k] + ": allocated " + p.allocatedBytes + " <= " + b);
        }
        // MemoryInfo: half the headroom above the threshold (here 3 x floor → 1.5 x floor).
        mb.clearTrim();
        long b = mb.onMemoryInfo(100L << 20, (100L << 20) - 3 * floor, false);
        check(b == 3 * floor / 2 && t.planInfo().budget == b, "MemoryInfo caps at half the headroom: " + b);
        check(mb.onMemoryInfo(100L << 20, 50L << 20, true) == floor, "lowMemory: the floor");
        int at = t.planInfo().steps;
        waitSteps(t, at + 2);
        check(t.planInfo().rung == 0 && t.planInfo().allocatedBytes <= floor, "at the floor: the smallest plan");
        stop.set(true);
        bg.join();
        check(thrown[0] == null, "training threw " + thrown[0]);
        int steps = losses.size() * epoch;
        check(losses.get(losses.size() - 1)[epoch - 1] < losses.get(0)[0], "the loss fell");
        Trainer.PlanInfo p = t.planInfo();
        check(p.steps == steps && p.switches >= 2, "steps " + p.steps + " of " + steps + ", switches " + p.switches);
        System.out.println("switches " + p.switches + " (" + p.midStepSwitches + " mid-step), rung " + p.rung + " of " + p.rungs);

        float[] probs = t.predict(test[0]);
        int right = 0;
        for (int i = 0; i < tn; i++) {
            int best = 0;
            for (int c = 1; c < 10; c++) if (probs[i * 10 + c] > probs[i * 10 + best]) best = c;
            if (best == (int) test[1][i]) right++;
        }
        double acc = (double) right / tn;
        System.out.printf("held-out accuracy %.2f %%%n", 100 * acc);
        check(acc >= 0.95, "held-out accuracy " + acc);

        // Weights out and back in.
        byte[] w = t.exportWeights();
        Trainer u = Trainer.create(model, w, Trainer.UNLIMITED, null);
        check(java.util.Arrays.equals(u.predict(row(test[0], 0)), t.predict(row(test[0], 0))), "exported weights predict the same");
        check(Trainer.liveTrainers() == 2, "two live trainers");
        u.close();
        t.close();
        expectCode(FrugalException.HANDLE, () -> t.planInfo(), "closed planInfo");
        expectCode(FrugalException.HANDLE, () -> t.trainSteps(1), "closed trainSteps");
        expectCode(FrugalException.HANDLE, () -> t.setBudget(Trainer.UNLIMITED), "closed setBudget");
        expectCode(FrugalException.HANDLE, () -> t.close(), "closed twice");
        check(Trainer.liveTrainers() == 0, "no live trainer");

        System.out.println(passed + " passed, " + failed + " failed");
        System.exit(failed == 0 ? 0 : 1);
    }
}
