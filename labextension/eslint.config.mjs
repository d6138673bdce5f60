// The TypeScript's lint, run by `make test` (make lint-ts): typescript-eslint's recommended rules
// with type information.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['lib/', 'dist/', 'node_modules/', '*.mjs', 'vitest.config.ts'] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: { parserOptions: { project: ['./tsconfig.test.json'], tsconfigRootDir: import.meta.dirname } },
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      // Lumino signals take (method, thisArg): the idiom of every JupyterLab extension.
      '@typescript-eslint/unbound-method': 'off',
      eqeqeq: ['error', 'smart'],
      curly: ['error', 'all']
    }
  }
);
