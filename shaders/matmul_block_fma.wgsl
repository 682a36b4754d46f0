// One k step of matmul.wgsl's register block for the accumulators ${A}00 .. ${A}11 (RT x RM
// outputs in 4 x 4 blocks: ${A}ij, tokens x_i, rows ${W}_j): included in the k loop once per
// matrix (A=a W=w; A=u W=v, GLU's up), as text so that each block keeps named registers.
            ${A}00 = outer_fma(${A}00, ${W}0, x0);
            if (RM == 8u) {
                ${A}01 = outer_fma(${A}01, ${W}1, x0);
            }
            if (RT == 8u) {
                ${A}10 = outer_fma(${A}10, ${W}0, x1);
            }
            if (RM == 8u && RT == 8u) {
                ${A}11 = outer_fma(${A}11, ${W}1, x1);
            }
