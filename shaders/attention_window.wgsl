// The first key a query row sees. Causal attention: key 0. With WINDOW (a local, sliding-window
// layer): the row at position p sees keys p - WINDOW + 1 .. p only (llama.cpp's standard SWA mask).
fn first_key(p: u32) -> u32 {
#ifdef WINDOW
    return select(0u, p + 1u - WINDOW, p + 1u > WINDOW);
#else
    return 0u;
#endif
}
