/* bench/read_order.c: where decode's weight reads lose speed, with run.c's own code.
   A decode step reads every weight matrix once. bench/stream reads one 1 GiB array;
   a decode step reads the checkpoint's mapped file as 85 matrices (110M shape),
   one matmul after another, with the rest of the forward pass (norms, rotation,
   attention, SwiGLU) between them. This probe times three readers of the same
   mapped checkpoint, one pass each, in alternating rounds:
     one region  run.c's matmul over the whole mapping as one matrix of dim-float
                 rows: the kernel on a single long read, as bench/stream reads
     matrices    run.c's matmuls, matrix by matrix in the forward pass's order and
                 groups (q, k, v together; W1, W3 together), nothing in between
     forward     run.c's forward(): one decode step, positions 0..255 in turn
   and prints GB/s (1e9 bytes a second) for each, the mean over the rounds, and the
   ratios. "matrices" against "one region" is what reading many matrices costs;
   "forward" against "matrices" what the work between them costs. Then "matrices"
   once more in each of the decode matmul's reading orders (run.c, "Making it fast",
   section 2), in the same alternating rounds, as GB/s and as a ratio to the first
   order: what decode's trial of the orders (run.c, section 5) chooses between. On a
   shared machine the rounds' speeds move together, so the ratio is taken within
   each round, and its median over the rounds printed with its range.
   Usage: OMP_NUM_THREADS=N bench/read_order MODEL [ROUNDS [orders]]   (make bench/read_order)
   "orders" times the reading orders only, by samples of one layer's matmuls, the
   orders taking turns on layers a quarter of the model apart (between two readings of
   a layer the rest of the model is read, as between two tokens of decode), ROUNDS x
   n_layers samples per order; it prints each order's GB/s at the lower quartile and
   the median of its samples' times, and their ratio to the first order's: on a busy
   machine the robust figures. (run itself tries the orders on decode's own layers.) */
#define RUN_TESTING
#include "../run.c"

#define PASSES 20 // passes of a reader per round: about a tenth of a second on 110M

// One token's decode matmuls of layer l, as forward_block calls them, on the run
// state's arrays.
static void layer_matmuls(Transformer *t, int l) {
    const Config *c = &t->config;
    const LayerWeights *lw = &t->weights.layer[l];
    RunState *s = &t->state;
    size_t dim = c->dim, kv_dim = (size_t)c->n_kv_heads * head_size_of(c), hidden = c->hidden_dim,
           q_dim = (size_t)c->n_heads * head_size_of(c);
    Projection qkv[3] = {{s->q, lw->wq, (int)q_dim}, {s->k, lw->wk, (int)kv_dim}, {s->v, lw->wv, (int)kv_dim}};
    matmuls(s, s->xb, qkv, 3, 1, (int)dim);
    matmul(s->xb2, s->xb, lw->wo, (int)q_dim, (int)dim);
    Projection w13[2] = {{s->hb, lw->w1, (int)hidden}, {s->hb2, lw->w3, (int)hidden}};
    matmuls(s, s->xb, w13, 2, 1, (int)dim);
    matmul(s->xb2, s->hb, lw->w2, (int)hidden, (int)dim);
}

// Every matmul of one decode step, in forward_block's order and groups.
static void all_matmuls(Transformer *t) {
    for (int l = 0; l < t->config.n_layers; l++) layer_matmuls(t, l);
    matmul(t->state.logits, t->state.x, t->weights.wcls, t->config.dim, t->config.vocab_size);
}

// The bytes all_matmuls (and a decode step) reads from the weights (of any type).
static double matmul_bytes(const Transformer *t) { return matrix_bytes_per_token(&t->config, &t->weights, NULL); }

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// layer_matmuls, timed: the seconds they took.
static double time_layer_matmuls(Transformer *t, int l) {
    double start = time_in_s();
    layer_matmuls(t, l);
    return time_in_s() - start;
}

// The orders-only probe: rounds x n_layers steps, each order a layer per step.
static void time_orders_by_layer(Transformer *t, int rounds) {
    const Config *c = &t->config;
    int L = c->n_layers, steps = rounds * L;
    double classifier = (double)weight_bytes(t->weights.wcls.type, (uint64_t)c->dim * c->vocab_size);
    double layer_bytes = (matmul_bytes(t) - classifier) / L;
    double *samples = malloc(sizeof(double) * N_READ_ORDERS * steps); // [order][step]
    for (int step = 0; step < steps; step++)
        for (int k = 0; k < N_READ_ORDERS; k++) {
            int o = (step + k) % N_READ_ORDERS;
            read_order = (ReadOrder)o;
            samples[o * steps + step] = time_layer_matmuls(t, (int)((step + (long)o * L / N_READ_ORDERS) % L));
        }
    double q[N_READ_ORDERS], m[N_READ_ORDERS];
    printf("by layer, %d samples per order (%.1f MB each): GB/s at the lower quartile and the median\n", steps,
           layer_bytes / 1e6);
    for (int o = 0; o < N_READ_ORDERS; o++) {
        double *own = samples + o * steps;
        qsort(own, steps, sizeof(double), compare_doubles);
        q[o] = layer_bytes / own[steps / 4] / 1e9, m[o] = layer_bytes / own[steps / 2] / 1e9;
        printf("  %-18s %6.1f GB/s (%.3fx)  %6.1f GB/s (%.3fx)\n", read_order_names[o], q[o], q[o] / q[0], m[o],
               m[o] / m[0]);
    }
    free(samples);
}

int main(int argc, char **argv) {
    int orders_only = argc == 4 && strcmp(argv[3], "orders") == 0;
    if (argc < 2 || argc > 4 || (argc == 4 && !orders_only)) {
        fprintf(stderr, "usage: OMP_NUM_THREADS=N bench/read_order MODEL [ROUNDS [orders]]\n");
        return 2;
    }
    int rounds = argc >= 3 ? atoi(argv[2]) : 10;
    Transformer t;
    if (rounds < 1) {
        fprintf(stderr, "read_order: ROUNDS must be a positive number\n");
        return 2;
    }
    if (load_checkpoint(&t, argv[1]) != 0 || build_run_state(&t.state, &t.config) != 0) {
        fprintf(stderr, "read_order: %s\n", error_message);
        return 1;
    }
    const Config *c = &t.config;
    int n_positions = c->seq_len < 256 ? c->seq_len : 256;
    prepare_to_run(&t, n_positions);

    // the whole mapping, from the first weight on, as rows of dim weights of the file's type
    Matrix region = t.weights.token_embedding;
    double weight_bytes_each = (double)weight_bytes(region.type, 1024) / 1024; // Q8_0: 34 bytes a block of 32
    size_t region_weights =
        (size_t)((double)(t.file_size - (size_t)((const char *)region.data - (const char *)t.mapped)) / weight_bytes_each);
    int region_rows = (int)(region_weights / c->dim);
    float *region_out = alloc_floats(region_rows);
    if (!region_out) {
        fprintf(stderr, "read_order: out of memory\n");
        return 1;
    }
    double bytes[3] = {weight_bytes_each * region_rows * c->dim, matmul_bytes(&t), matmul_bytes(&t)};
    const char *names[3] = {"one region", "matrices", "forward"};
    double gbs[3] = {0}, order_gbs[N_READ_ORDERS] = {0};
    double *ratios = malloc(sizeof(double) * N_READ_ORDERS * rounds); // [order][round]: this round's ratio to order 0
    double this_round[N_READ_ORDERS];
    int pos = 0;
    ReadOrder chosen = read_order;
    if (orders_only) {
        printf("read_order: %s\n", argv[1]);
        time_orders_by_layer(&t, rounds);
        free_transformer(&t);
        return 0;
    }
    for (int r = 0; r < rounds; r++) {
        for (int o = 0; o < N_READ_ORDERS; o++) {
            read_order = (ReadOrder)o;
            double t0 = time_in_s();
            for (int p = 0; p < PASSES; p++) all_matmuls(&t);
            this_round[o] = PASSES * matmul_bytes(&t) / (time_in_s() - t0) / 1e9;
            order_gbs[o] += this_round[o] / rounds;
        }
        for (int o = 0; o < N_READ_ORDERS; o++) ratios[o * rounds + r] = this_round[o] / this_round[0];
        read_order = chosen;
        for (int k = 0; k < 3; k++) {
            double t0 = time_in_s();
            for (int p = 0; p < PASSES; p++) {
                if (k == 0) matmul(region_out, t.state.xb, region, c->dim, region_rows);
                if (k == 1) all_matmuls(&t);
                if (k == 2) {
                    forward(&t, 1, pos);
                    pos = (pos + 1) % n_positions;
                }
            }
            gbs[k] += PASSES * bytes[k] / (time_in_s() - t0) / 1e9 / rounds;
        }
    }
    printf("read_order: %s, %d rounds of %d passes each\n", argv[1], rounds, PASSES);
    for (int k = 0; k < 3; k++) printf("%-10s  %6.1f GB/s\n", names[k], gbs[k]);
    printf("matrices / one region %.0f%%, forward / matrices %.0f%%, forward / one region %.0f%%\n",
           100 * gbs[1] / gbs[0], 100 * gbs[2] / gbs[1], 100 * gbs[2] / gbs[0]);
    printf("matrices by reading order (the first three above: %s):\n", read_order_names[chosen]);
    for (int o = 0; o < N_READ_ORDERS; o++) {
        double *own = ratios + o * rounds;
        qsort(own, rounds, sizeof(double), compare_doubles);
        printf("  %-18s %6.1f GB/s  ratio to %s by round: median %.3f, %.3f-%.3f\n", read_order_names[o],
               order_gbs[o], read_order_names[0], own[rounds / 2], own[0], own[rounds - 1]);
    }
    free(ratios);
    free(region_out);
    free_transformer(&t);
    return 0;
}
