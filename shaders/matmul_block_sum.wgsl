// HALF: matmul.wgsl's f16 register block ${A}00 .. ${A}11, one slice's partial dots, added into
// the f32 accumulators ${S}00 .. ${S}11: included after the k loop once per matrix (S=s A=a;
// S=r A=u, GLU's up).
        ${S}00 += mat4x4<f32>(${A}00);
        if (RM == 8u) {
            ${S}01 += mat4x4<f32>(${A}01);
        }
        if (RT == 8u) {
            ${S}10 += mat4x4<f32>(${A}10);
        }
        if (RM == 8u && RT == 8u) {
            ${S}11 += mat4x4<f32>(${A}11);
        }
