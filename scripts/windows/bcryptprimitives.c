/*
 * Test infrastructure for scripts/windows-check.sh, never shipped with the
 * crate: a bcryptprimitives.dll exporting ProcessPrng for wine 8.0, which
 * lacks it. Rust's std imports ProcessPrng on Windows (its random seeds, e.g.
 * HashMap's), so without this DLL no Rust test binary starts under that wine.
 * It fills the buffer from BCryptGenRandom, which wine implements; on Windows
 * itself the system's bcryptprimitives.dll is used and this file plays no part.
 */
#include <windows.h>
#include <bcrypt.h>

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len)
{
    while (len > 0) {
        ULONG n = len > 0x80000000u ? 0x80000000u : (ULONG)len;
        if (!BCRYPT_SUCCESS(BCryptGenRandom(NULL, data, n, BCRYPT_USE_SYSTEM_PREFERRED_RNG)))
            return FALSE;
        data += n;
        len -= n;
    }
    return TRUE;
}
